//! The idle controller against the recording backend on an injected clock: random
//! submit / batch / complete / tick / advance sequences never release a vote while a request
//! or batch is in flight, always re-apply the votes before a batch, and release exactly when
//! the idle time has passed.

use std::sync::Arc;
use std::time::Duration;

use device_worker::power::{
    Clock, IdleConfig, IdleController, ManualClock, PowerState, RecordingBackend, TickAction, Votes,
};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    Submit,
    BeginBatch,
    EndBatch,
    Complete,
    Advance(u64),
    Tick,
    /// Wait as the engine does: advance to the next deadline, then tick.
    SleepUntilDeadline,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => Just(Op::Submit),
        3 => Just(Op::BeginBatch),
        3 => Just(Op::EndBatch),
        2 => Just(Op::Complete),
        3 => (0u64..5_000).prop_map(Op::Advance),
        3 => Just(Op::Tick),
        2 => Just(Op::SleepUntilDeadline),
    ]
}

const RELEASE: Duration = Duration::from_millis(3000);
const UNLOAD: Duration = Duration::from_millis(20_000);

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn votes_follow_the_in_flight_work(ops in prop::collection::vec(op(), 1..120)) {
        let clock = ManualClock::new();
        let rec = RecordingBackend::new(Arc::new(clock.clone()));
        let idle = IdleController::new(
            Box::new(rec.clone()),
            Arc::new(clock.clone()),
            IdleConfig { idle_release: RELEASE, unload_after_idle: Some(UNLOAD) },
        );
        prop_assert_eq!(rec.current(), Some(Votes::ACTIVE));
        // The test's own model of the engine.
        let (mut submitted, mut batches) = (0usize, 0usize);
        let mut last_activity = clock.now();
        let mut unloaded = false;
        let mut releases = 0u64;
        for op in ops {
            let n_changes = rec.changes().len();
            let state_before = idle.state();
            match op {
                Op::Submit => { idle.submit(); submitted += 1; last_activity = clock.now(); }
                Op::Complete => {
                    if submitted == 0 || batches > 0 { continue; }
                    idle.complete(); submitted -= 1; last_activity = clock.now();
                }
                Op::BeginBatch => {
                    // The engine runs one batch at a time, for a submitted request.
                    if submitted == 0 || batches > 0 { continue; }
                    if unloaded { idle.reloaded(); unloaded = false; }
                    let woke = idle.begin_batch();
                    batches += 1;
                    prop_assert_eq!(rec.current(), Some(Votes::ACTIVE), "a batch started with votes released");
                    prop_assert_eq!(woke.is_some(), state_before != PowerState::Active);
                }
                Op::EndBatch => {
                    if batches == 0 { continue; }
                    idle.end_batch(); batches -= 1; last_activity = clock.now();
                }
                Op::Advance(ms) => clock.advance(Duration::from_millis(ms)),
                Op::Tick | Op::SleepUntilDeadline => {
                    if matches!(op, Op::SleepUntilDeadline) {
                        match idle.until_next_deadline() {
                            Some(d) => clock.advance(d),
                            None => {
                                // No deadline: only while something is in flight or unloaded.
                                prop_assert!(submitted > 0 || batches > 0 || idle.state() == PowerState::Unloaded);
                                continue;
                            }
                        }
                    }
                    let idle_for = clock.now() - last_activity;
                    let a = idle.tick();
                    let quiet = submitted == 0 && batches == 0;
                    let expect = match state_before {
                        PowerState::Active if quiet && idle_for >= RELEASE => TickAction::Released,
                        PowerState::Released if quiet && idle_for >= UNLOAD => TickAction::Unload,
                        _ => TickAction::None,
                    };
                    prop_assert_eq!(a, expect, "idle {:?}, in flight {}/{}", idle_for, submitted, batches);
                    if matches!(op, Op::SleepUntilDeadline) {
                        prop_assert_ne!(a, TickAction::None, "the deadline passed without an action");
                    }
                    if a == TickAction::Released { releases += 1; }
                    if a == TickAction::Unload { unloaded = true; }
                }
            }
            // A release may only happen on a tick with nothing in flight.
            let changes = rec.changes();
            for c in &changes[n_changes..] {
                if c.votes == Votes::RELEASED {
                    prop_assert!(submitted == 0 && batches == 0, "released with {}/{} in flight", submitted, batches);
                    prop_assert!(c.at - last_activity >= RELEASE);
                }
            }
            prop_assert_eq!(idle.in_flight(), (submitted, batches));
        }
        // Changes alternate active/released, starting active.
        for (i, c) in rec.changes().iter().enumerate() {
            prop_assert_eq!(c.votes, if i % 2 == 0 { Votes::ACTIVE } else { Votes::RELEASED });
        }
        prop_assert_eq!(idle.figures().release_cycles, releases);
    }
}

#[test]
fn wake_latency_and_time_released_are_counted() {
    let clock = ManualClock::new();
    let rec = RecordingBackend::new(Arc::new(clock.clone()));
    let idle = IdleController::new(
        Box::new(rec.clone()),
        Arc::new(clock.clone()),
        IdleConfig {
            idle_release: Duration::from_millis(10),
            unload_after_idle: None,
        },
    );
    clock.advance(Duration::from_millis(10));
    assert_eq!(idle.tick(), TickAction::Released);
    assert_eq!(
        idle.until_next_deadline(),
        None,
        "released, no unload: no timeout"
    );
    clock.advance(Duration::from_millis(500));
    idle.submit();
    clock.advance(Duration::from_millis(3));
    let woke = idle.begin_batch().expect("votes re-applied");
    assert_eq!(woke, Duration::from_millis(3));
    let f = idle.figures();
    assert_eq!(f.release_cycles, 1);
    assert_eq!(f.time_released, Duration::from_millis(503));
    assert_eq!(f.wake_latency.count, 1);
    assert_eq!(f.state, PowerState::Active);
    let times: Vec<_> = rec.changes().iter().map(|c| c.at.as_millis()).collect();
    assert_eq!(times, vec![0, 10, 513]);
}
