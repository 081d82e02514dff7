//! Model output -> `Action` (`parse_action`, and `extract_action_json` then `parse_action` as
//! for free-form output). Properties: no panic; an accepted action's index is below the control
//! count; an accepted action written back as JSON (`to_compact_json`) parses to itself.
#![no_main]

use agent_gateway::action::{extract_action_json, parse_action};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let extracted = extract_action_json(text);
    if let Some(json) = extracted {
        assert!(text.contains(json));
    }
    for input in std::iter::once(text).chain(extracted) {
        for n_controls in [0, 16, u32::MAX] {
            let Ok(action) = parse_action(input, n_controls) else { continue };
            if let Some(i) = action.index() {
                assert!(i < n_controls);
            }
            let again = parse_action(&action.to_compact_json(), n_controls).expect("written action parses");
            assert_eq!(again, action);
        }
    }
});
