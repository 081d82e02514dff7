//! Every uiautomator dump and AndroidWorld element list in the real corpus parses to a sane
//! screen, and the odd / malformed files listed in SOURCES.md give a sane screen or a clear
//! error, never a panic.

use std::path::{Path, PathBuf};

use agent_gateway::error::ObservationError;
use agent_gateway::observation::{
    parse_android_world, parse_android_world_repr, parse_uiautomator, parse_uiautomator_bytes, Screen,
};

/// The corpus root (`TANDEM_CORPUS`, else `<repo>/../shared/corpus/raw`): a required input,
/// the test fails when it is missing.
fn corpus() -> PathBuf {
    test_support::corpus_dir()
}


fn read(rel: &str) -> Vec<u8> {
    let p = corpus().join(rel);
    std::fs::read(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
}

fn xml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            xml_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "xml") {
            out.push(p);
        }
    }
}

/// Invariants every parsed screen must satisfy.
fn check_sane(screen: &Screen, what: &str) {
    assert!(!screen.controls.is_empty(), "{what}: no controls");
    assert!(screen.width > 0 && screen.height > 0, "{what}: size {}x{}", screen.width, screen.height);
    for (i, c) in screen.controls.iter().enumerate() {
        assert!(c.bounds.area() > 0, "{what}: control {i} has no area: {c:?}");
        assert!(c.bounds.intersects_screen(screen.width, screen.height), "{what}: control {i} off-screen: {c:?}");
        assert!(
            c.is_interactive() || !c.text.trim().is_empty() || !c.content_desc.trim().is_empty(),
            "{what}: control {i} neither interactive nor labelled: {c:?}"
        );
        if i > 0 {
            assert!(c.index > screen.controls[i - 1].index, "{what}: indices not increasing at {i}");
        }
        assert!(!c.class.contains('.'), "{what}: class not shortened: {}", c.class);
        assert!(!c.resource_id.contains(":id/"), "{what}: resource id not shortened: {}", c.resource_id);
    }
}

#[test]
fn every_corpus_xml_parses_or_fails_clearly() {
    let mut files = Vec::new();
    xml_files(&corpus(), &mut files);
    assert!(files.len() >= 30, "expected the corpus XML dumps, found {}", files.len());
    let mut parsed = 0;
    for f in &files {
        let rel = f.strip_prefix(corpus()).unwrap().to_string_lossy().into_owned();
        match parse_uiautomator_bytes(&std::fs::read(f).unwrap()) {
            Ok(s) => {
                check_sane(&s, &rel);
                parsed += 1;
                eprintln!("{rel}: {} controls, {}x{}, fg {:?}", s.controls.len(), s.width, s.height, s.foreground_package);
            }
            // The only documented empty screen: one node with displayed="false".
            Err(ObservationError::Empty) => assert!(rel.ends_with("current_ui_source.xml"), "{rel}: unexpectedly empty"),
            Err(e) => panic!("{rel}: {e}"),
        }
    }
    assert_eq!(parsed, files.len() - 1);
}

#[test]
fn junk_prefix_crlf_cp949_and_appium_tags() {
    // Tool log line before <?xml, CRLF, CP949 bytes under a UTF-8 declaration, Appium tags.
    let bytes = read("uiautomator_xml/ivi_vehicle/ui_dump.xml");
    assert!(std::str::from_utf8(&bytes).is_err(), "fixture is expected to hold non-UTF-8 bytes");
    let s = parse_uiautomator_bytes(&bytes).unwrap();
    check_sane(&s, "ivi ui_dump");
    assert_eq!((s.width, s.height), (1920, 957), "size from the <hierarchy> attributes");
    // Appium tags carry the class as the element name too; no control keeps a dotted class.
    assert!(s.controls.iter().all(|c| !c.class.is_empty()));
    assert!(s.controls.iter().any(|c| c.clickable));
}

#[test]
fn select_string_prefix_and_hard_wraps() {
    let bytes = read("uiautomator_xml/malformed_in_the_wild/erbete_wrapped_selectstring.txt");
    let s = parse_uiautomator_bytes(&bytes).unwrap();
    check_sane(&s, "erbete");
    assert_eq!(s.foreground_package.as_deref(), Some("com.erbete.customer"));
    // The wrapped content-desc keeps its words (newlines become whitespace).
    assert!(s.controls.iter().any(|c| c.content_desc.contains("PLACEHOLDER_ADDRESS")));
}

#[test]
fn invisible_only_screen_is_empty() {
    let bytes = read("uiautomator_xml/ivi_vehicle/current_ui_source.xml");
    assert_eq!(parse_uiautomator_bytes(&bytes), Err(ObservationError::Empty));
}

#[test]
fn ecovacs_multi_window_picks_the_app() {
    for v in 1..=5 {
        let s = parse_uiautomator_bytes(&read(&format!("uiautomator_xml/ecovacs/ui_dump_v{v}.xml"))).unwrap();
        assert_eq!(s.foreground_package.as_deref(), Some("com.eco.global.app"));
        // Controls come from more than one window (system bars and the app).
        let packages: std::collections::BTreeSet<&str> = s.controls.iter().map(|c| c.package.as_str()).collect();
        assert!(packages.len() >= 2, "v{v}: packages {packages:?}");
    }
}

#[test]
fn pretty_printed_with_wrapped_attributes() {
    let s = parse_uiautomator_bytes(&read("llamatouch_evaluator/test_asset/1.xml")).unwrap();
    check_sane(&s, "test_asset/1.xml");
}

#[test]
fn leading_whitespace_appium_source() {
    let xml = "  \n\t<?xml version=\"1.0\" encoding=\"UTF-8\"?><hierarchy index=\"0\" class=\"hierarchy\" width=\"1080\" height=\"1920\">\
        <android.widget.FrameLayout index=\"0\" package=\"com.xueqiu\" bounds=\"[0,0][1080,1920]\" displayed=\"true\">\
        <android.widget.Button index=\"0\" instance=\"0\" package=\"com.xueqiu\" text=\"登录\" clickable=\"true\" bounds=\"[40,100][400,200]\" displayed=\"true\"/>\
        <android.widget.ImageView NAF=\"true\" index=\"1\" package=\"com.xueqiu\" clickable=\"true\" bounds=\"[500,100][600,200]\"/>\
        </android.widget.FrameLayout></hierarchy>";
    let s = parse_uiautomator(xml).unwrap();
    assert_eq!(s.controls.len(), 2);
    assert_eq!(s.controls[0].class, "Button");
    assert_eq!(s.controls[0].text, "登录");
    assert_eq!(s.controls[1].class, "ImageView");
    assert_eq!(s.controls[1].index, 1);
}

#[test]
fn malformed_and_empty_inputs_give_clear_errors() {
    assert_eq!(parse_uiautomator(""), Err(ObservationError::Empty));
    assert_eq!(parse_uiautomator("  \r\n"), Err(ObservationError::Empty));
    assert!(matches!(parse_uiautomator("hello world"), Err(ObservationError::NotXml { .. })));
    assert_eq!(
        parse_uiautomator("<?xml version='1.0'?><hierarchy rotation=\"0\"></hierarchy>"),
        Err(ObservationError::Empty)
    );
    // Truncated: a clear MalformedXml.
    let truncated = "<?xml version='1.0'?>\n<hierarchy><node text=\"a\" bounds=\"[0,0][10,10]\"";
    assert!(matches!(parse_uiautomator(truncated), Err(ObservationError::MalformedXml { .. })));
    // The error position counts from the caller's text (junk line included).
    let bad_attr = "junk line\n<?xml version='1.0'?>\n<hierarchy><node text=a/></hierarchy>";
    match parse_uiautomator(bad_attr) {
        Err(ObservationError::MalformedXml { line, column, message }) => {
            assert_eq!(line, 3, "{message}");
            assert_eq!(column, 23, "{message}");
        }
        other => panic!("expected MalformedXml, got {other:?}"),
    }
    // Truncating every real dump at several points never panics.
    let full = read("llamatouch_evaluator/trace_7/2.xml");
    for cut in (0..full.len()).step_by(997) {
        let _ = parse_uiautomator_bytes(&full[..cut]);
    }
}

#[test]
fn zero_area_offscreen_and_label_merging() {
    let xml = r#"<hierarchy rotation="0">
      <node class="android.widget.FrameLayout" package="p" bounds="[0,0][1000,2000]">
        <node class="android.widget.LinearLayout" package="p" clickable="true" bounds="[0,100][1000,300]">
          <node class="android.widget.TextView" package="p" text="Timeline" bounds="[10,110][500,200]"/>
          <node class="android.widget.TextView" package="p" text="Your places" bounds="[10,200][500,290]"/>
          <node class="android.widget.CheckBox" package="p" checkable="true" checked="true" bounds="[900,110][990,200]"/>
        </node>
        <node class="android.widget.TextView" package="p" text="zero" bounds="[5,5][5,50]"/>
        <node class="android.widget.Button" package="p" text="off" clickable="true" bounds="[1200,0][1300,50]"/>
        <node class="android.widget.TextView" package="p" text="Header" bounds="[0,400][1000,500]"/>
        <node class="android.widget.EditText" package="p" resource-id="p:id/query" hint="Search" bounds="[0,500][1000,600]"/>
      </node>
    </hierarchy>"#;
    let s = parse_uiautomator(xml).unwrap();
    assert_eq!((s.width, s.height), (1000, 2000), "size from the root window bounds");
    let labels: Vec<(&str, &str)> = s.controls.iter().map(|c| (c.class.as_str(), c.text.as_str())).collect();
    assert_eq!(
        labels,
        vec![("LinearLayout", "Timeline | Your places"), ("CheckBox", ""), ("TextView", "Header"), ("EditText", "")]
    );
    let idx: Vec<u32> = s.controls.iter().map(|c| c.index).collect();
    assert_eq!(idx, vec![0, 1, 2, 3]);
    assert!(s.controls[1].checked && s.controls[1].checkable);
    assert!(s.controls[3].editable);
    assert_eq!(s.controls[3].resource_id, "query");
    assert_eq!(s.controls[3].hint, "Search");
    assert_eq!(s.hit_test(50, 150).map(|c| c.index), Some(0));
    assert_eq!(s.hit_test(950, 150).map(|c| c.index), Some(1));
}

#[test]
fn android_world_json_from_episode_log() {
    let log: serde_json::Value =
        serde_json::from_slice(&read("androidworld_episodes_t3a/ContactsAddContact_base_o4-mini_trial1.json")).unwrap();
    let records = log["step_records"].as_array().unwrap();
    for (i, r) in records.iter().enumerate() {
        let elements = &r["state"]["ui_elements"];
        let s = parse_android_world(&elements.to_string()).unwrap_or_else(|e| panic!("step {i}: {e}"));
        check_sane(&s, &format!("step {i}"));
        // Source indices are kept: each control is the element at its index.
        for c in &s.controls {
            let e = &elements[c.index as usize];
            assert_eq!(c.text, e["text"].as_str().unwrap_or(""));
            assert_eq!(c.clickable, e["is_clickable"].as_bool().unwrap());
        }
        assert!(s.index_bound() as usize <= elements.as_array().unwrap().len());
    }
}

#[test]
fn android_world_repr_matches_json_shape() {
    let text = String::from_utf8(read("androidworld_ui_elements/ui_log.txt")).unwrap();
    let first_line = text.lines().next().unwrap();
    let s = parse_android_world_repr(first_line).unwrap();
    check_sane(&s, "ui_log repr");
    let phone = s.controls.iter().find(|c| c.text == "Phone").expect("Phone icon listed");
    assert_eq!(phone.index, 2);
    assert_eq!((phone.bounds.x1, phone.bounds.y1, phone.bounds.x2, phone.bounds.y2), (76, 1873, 249, 2068));
    assert!(phone.clickable && phone.long_clickable);
    assert_eq!(s.foreground_package.as_deref(), Some("com.google.android.apps.nexuslauncher"));
    // Trailing text after the list is rejected with a position.
    assert!(matches!(parse_android_world_repr(&text), Err(ObservationError::MalformedElements { line: 2, .. })));
}

#[test]
fn android_world_bad_inputs() {
    assert_eq!(parse_android_world(""), Err(ObservationError::Empty));
    assert_eq!(parse_android_world("[]"), Err(ObservationError::Empty));
    assert!(matches!(parse_android_world("[{\"text\": 1"), Err(ObservationError::MalformedElements { .. })));
    assert!(matches!(parse_android_world("42"), Err(ObservationError::UnexpectedShape { .. })));
    assert!(matches!(parse_android_world("[1, 2]"), Err(ObservationError::UnexpectedShape { .. })));
    // Invisible and zero-area elements are left out, keeping the others' indices.
    let json = r#"[
      {"text": "a", "class_name": "android.widget.TextView", "bbox_pixels": {"x_min": 0, "x_max": 100, "y_min": 0, "y_max": 100}},
      {"text": "hidden", "is_visible": false, "bbox_pixels": {"x_min": 0, "x_max": 100, "y_min": 0, "y_max": 100}},
      {"text": "flat", "bbox_pixels": {"x_min": 0, "x_max": 100, "y_min": 50, "y_max": 50}},
      {"content_desc": "short form", "class": "android.widget.Button", "bbox_pixels": [10, 10, 60, 60]}
    ]"#;
    let s = parse_android_world(json).unwrap();
    let idx: Vec<u32> = s.controls.iter().map(|c| c.index).collect();
    assert_eq!(idx, vec![0, 3]);
    assert_eq!(s.index_bound(), 4);
    assert!(s.control(1).is_none());
    assert_eq!(s.control(3).map(|c| c.class.as_str()), Some("Button"));
}

/// A dump nested 20,000 levels deep (hostile input) parses without overflowing the stack.
#[test]
fn deeply_nested_xml_does_not_overflow_the_stack() {
    let depth = 20_000;
    let xml = format!(
        "<hierarchy>{}<node text=\"x\" clickable=\"true\" bounds=\"[0,0][10,10]\"/>{}</hierarchy>",
        "<node bounds=\"[0,0][1,1]\">".repeat(depth),
        "</node>".repeat(depth)
    );
    // Run on a thread with a small stack, as a tokio worker has.
    let handle = std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(move || agent_gateway::observation::parse_uiautomator(&xml).map(|s| s.controls.len()))
        .unwrap();
    match handle.join().expect("parser thread must not crash") {
        Ok(n) => assert_eq!(n, 1),
        Err(e) => assert!(!e.to_string().is_empty()),
    }
}
