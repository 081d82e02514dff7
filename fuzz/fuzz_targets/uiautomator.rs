//! uiautomator XML dumps (`adb shell uiautomator dump`) -> `Screen`, then the control selection
//! the gateway's prompt uses. Property: no panic; a parsed screen's controls lie within its
//! index bound and the selection keeps at most the asked-for number of controls.
#![no_main]

use agent_gateway::observation::{parse_uiautomator_bytes, select_controls, DEFAULT_MAX_CONTROLS};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(screen) = parse_uiautomator_bytes(data) else { return };
    let bound = screen.index_bound();
    assert!(screen.controls.iter().all(|c| c.index < bound));
    for max in [1, DEFAULT_MAX_CONTROLS] {
        let sel = select_controls(&screen, max);
        assert!(sel.shown.controls.len() <= max.max(1));
        assert_eq!(sel.shown.controls.len() + sel.left_out, screen.controls.len());
    }
    for c in &screen.controls {
        let (x, y) = c.bounds.center();
        let _ = screen.hit_test(x as i64, y as i64);
        let _ = c.label();
    }
});
