//! AndroidWorld UI-element lists -> `Screen`: the JSON form (`parse_android_world`) and the
//! Python-repr form (`parse_android_world_repr`, the pyrepr literal parser), on the same text.
//! Property: no panic (deep nesting included); a parsed screen's controls lie within its
//! index bound.
#![no_main]

use agent_gateway::observation::{parse_android_world, parse_android_world_repr};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    for screen in [parse_android_world(text), parse_android_world_repr(text)].into_iter().flatten() {
        let bound = screen.index_bound();
        assert!(screen.controls.iter().all(|c| c.index < bound));
    }
});
