//! Agent traffic on the real engine (issue 21, items 1 and 2): a repeated prompt processes at
//! most what a KV cache would (the end-of-prompt state, `state/planner/plan.rs`), with the
//! output of a cold run; and episodes keep their slots (`state/slot.rs` `choose_slot`), the
//! shared rules prefix of a new episode coming through the prompt cache.
//! Real GGUF models: the tiny hybrid Qwen3.5 fixture and the default model (SmolLM2).

use std::collections::HashMap;
use std::path::PathBuf;

use device_worker::config::EngineOptions;
use tandem_proto::step::v1 as pb;

mod common;
mod support;

/// The tiny hybrid fixture (a required input).
fn tiny() -> PathBuf {
    support::qwen35::fixture("tiny-qwen35-q8_0.gguf")
}

/// Rules shared by every episode (the system message), about 200 tokens on both tokenizers.
fn rules() -> String {
    (0..24)
        .map(|i| format!("rule {i}: answer with one JSON action for the screen"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The user message of `episode` at `step`: a task line, then one history line per step.
fn user(episode: usize, step: usize) -> String {
    let mut s = format!("task {episode}: open the settings of app {episode}\nscreen:");
    for k in 0..=step {
        s.push_str(&format!("\nstep {k} tapped element {} of episode {episode}", k + 3));
    }
    s
}

/// The tiny fixture on a worker with `n` slots (the tests' common options otherwise).
fn with_slots(n: usize) -> EngineOptions {
    EngineOptions { slots: n, ..common::config(tiny()) }
}

fn raw(session: &str, ids: Vec<u32>, max_tokens: u32) -> pb::GenerateRequest {
    pb::GenerateRequest {
        session_id: session.into(),
        prompt: Some(pb::generate_request::Prompt::Tokens(pb::TokenPrompt { ids })),
        max_tokens,
        ..Default::default()
    }
}

fn token_ids(c: &common::Collected) -> Vec<u32> {
    c.tokens.iter().map(|t| t.id).collect()
}

/// Sends `req` three times on one slot: the first is a cold run; the repeats must process at
/// most what a KV cache would (`prompt − kv_bound`, one token) and give the same tokens.
async fn repeat_three_times(model: PathBuf, req: pb::GenerateRequest, what: &str) {
    let mut w = common::start_worker(common::config(model)).await;
    let cold = common::generate(&mut w.client, req.clone()).await.expect("cold run");
    let cold_done = cold.done.clone().expect("final stats");
    assert!(cold_done.prompt_tokens >= 90, "{what}: a prompt of {} tokens", cold_done.prompt_tokens);
    for repeat in 1..3 {
        let r = common::generate(&mut w.client, req.clone()).await.expect("repeat");
        let d = r.done.clone().expect("final stats");
        let kv_new = d.prompt_tokens - d.kv_bound_tokens;
        assert_eq!(kv_new, 1, "{what}: an identical prompt shares all but its last token");
        assert!(
            d.new_tokens <= kv_new,
            "{what} repeat {repeat}: {} new tokens, a KV cache processes {kv_new}",
            d.new_tokens
        );
        assert_eq!(d.reused_tokens + d.new_tokens, d.prompt_tokens);
        assert_eq!(token_ids(&r), token_ids(&cold), "{what} repeat {repeat}: output of the cold run");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_prompt_processes_at_most_what_a_kv_cache_would() {
    let chat = common::chat("s", &rules(), &user(0, 3), 8);
    // Raw token prompts below the tiny fixture's regular tokens (476).
    let ids: Vec<u32> = (0..100u32).map(|i| 10 + (i * 37) % 400).collect();
    for (model, name) in [(tiny(), "tiny qwen35"), (common::model_path(), "SmolLM2")] {
        repeat_three_times(model.clone(), chat.clone(), &format!("{name}, chat")).await;
        repeat_three_times(model, raw("r", ids.clone(), 8), &format!("{name}, raw tokens")).await;
    }
}

/// One finished request as the test sees it.
struct Served {
    episode: usize,
    step: usize,
    slot: u32,
    reused: u32,
}

async fn status(w: &mut common::TestWorker) -> pb::StatusResponse {
    w.client.status(pb::StatusRequest {}).await.expect("status").into_inner()
}

/// Runs `order` (episode, step) on `w`; checks after every request that no live session
/// lost its slot while another slot was free, and counts the evictions Status reports.
async fn serve_order(w: &mut common::TestWorker, order: &[(usize, usize)]) -> Vec<Served> {
    let mut out = Vec::new();
    let mut expected_evictions = 0;
    for &(ep, step) in order {
        let before = status(w).await;
        let session = format!("episode-{ep}");
        let bound: Vec<&str> = before.slots.iter().map(|s| s.session_id.as_str()).filter(|s| !s.is_empty()).collect();
        // No slots listed yet: the model loads with the first request, every slot free.
        let free = before.slots.is_empty() || before.slots.iter().any(|s| s.session_id.is_empty());
        let is_new = !bound.contains(&session.as_str());
        let c = common::generate(&mut w.client, common::chat(&session, &rules(), &user(ep, step), 4))
            .await
            .expect("request");
        let d = c.done.expect("final stats");
        let after = status(w).await;
        let now: Vec<&str> = after.slots.iter().map(|s| s.session_id.as_str()).collect();
        if free || !is_new {
            for s in &bound {
                assert!(now.contains(s), "{s} lost its slot to {session} although a slot was free: {now:?}");
            }
        } else {
            expected_evictions += 1;
        }
        assert!(now.contains(&session.as_str()), "{session} holds a slot: {now:?}");
        assert_eq!(after.cache.as_ref().map(|c| c.live_slot_evictions), Some(expected_evictions));
        let slot = c.prefill.expect("prefill stats").slot_id;
        out.push(Served { episode: ep, step, slot, reused: d.reused_tokens });
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_episodes_over_two_slots_keep_their_slots_and_reuse_as_much_as_alone() {
    const EPISODES: usize = 8;
    const STEPS: usize = 3;
    // Alone: each episode on a fresh 1-slot worker.
    let mut alone: HashMap<(usize, usize), u32> = HashMap::new();
    for ep in 0..EPISODES {
        let mut w = common::start_worker(with_slots(1)).await;
        let order: Vec<(usize, usize)> = (0..STEPS).map(|s| (ep, s)).collect();
        for s in serve_order(&mut w, &order).await {
            alone.insert((s.episode, s.step), s.reused);
        }
    }
    // Interleaved over 2 slots: pairs of episodes alternate (each has a slot to itself),
    // then all eight round-robin (slots change hands), then pairs again.
    let mut order = Vec::new();
    for pair in [(0, 1), (2, 3)] {
        for s in 0..STEPS {
            order.extend([(pair.0, s), (pair.1, s)]);
        }
    }
    for ep in 4..EPISODES {
        order.push((ep, 0));
    }
    for pair in [(4, 5), (6, 7)] {
        for s in 1..STEPS {
            order.extend([(pair.0, s), (pair.1, s)]);
        }
    }
    let mut w = common::start_worker(with_slots(2)).await;
    let served = serve_order(&mut w, &order).await;
    let slots_used: std::collections::BTreeSet<u32> = served.iter().map(|s| s.slot).collect();
    assert_eq!(slots_used.len(), 2, "both slots serve episodes");
    // The second episode's first request finds the shared rules through the prompt cache
    // (slot 0 holds episode 0): it reuses them on its own slot.
    let first_of_1 = served.iter().find(|s| (s.episode, s.step) == (1, 0)).expect("episode 1");
    assert_ne!(first_of_1.slot, served[0].slot);
    assert!(first_of_1.reused > 0, "episode 1 reused nothing of the rules");
    // Every later request of an episode that kept its slot since its previous request
    // reuses at least as much as when the episode ran alone.
    let mut checked = 0;
    for (i, s) in served.iter().enumerate() {
        let Some(prev) = served[..i].iter().rposition(|p| p.episode == s.episode) else {
            continue;
        };
        let had_slot = served[prev].slot == s.slot
            && served[prev + 1..i].iter().all(|o| o.slot != s.slot);
        if had_slot {
            let a = alone[&(s.episode, s.step)];
            assert!(s.reused >= a, "episode {} step {}: reused {} < {a} alone", s.episode, s.step, s.reused);
            checked += 1;
        }
    }
    assert!(checked >= 12, "only {checked} requests had their slot to themselves");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_per_slot_is_kv_of_the_context_plus_one_recurrent_state() {
    // What a concurrent episode costs (README "Slots and episodes"), from the engine's own
    // accounting (Status): the KV cache of the whole context plus one recurrent state per
    // slot; checkpoints (at most --checkpoints + 1 per slot) and the shared prompt cache
    // come on top, reported as checkpoint_bytes_held.
    for (model, name) in [(tiny(), "tiny qwen35"), (common::model_path(), "SmolLM2")] {
        let opts = EngineOptions { ctx_size: 4096, ..common::config(model) };
        let mut w = common::start_worker(opts).await;
        let req = common::chat("m", &rules(), &user(0, 0), 2);
        common::generate(&mut w.client, req).await.expect("request");
        let st = status(&mut w).await;
        let c = st.cache.expect("cache info");
        let n_ctx = u64::from(st.model.expect("model info").context_length.min(4096));
        let per_slot = c.kv_bytes_total / u64::from(c.n_slots);
        eprintln!(
            "{name}: {per_slot} bytes per slot at {n_ctx} tokens ({} KV bytes per token, {} bytes per recurrent state), {} bytes of checkpoints and prompt cache held",
            c.kv_bytes_per_token, c.checkpoint_bytes, c.checkpoint_bytes_held
        );
        assert_eq!(per_slot, n_ctx * c.kv_bytes_per_token + c.checkpoint_bytes, "{name}");
        assert!(c.checkpoint_bytes_held <= u64::from(c.n_slots) * (u64::from(c.checkpoints_per_slot) + 1) * c.checkpoint_bytes + c.prompt_cache_bytes_limit);
    }
}
