//! The dry-run planner and the checkpoint store on their own: scenario tests (token counts,
//! not log lines) and a property test of the store's invariants over random request
//! sequences (sorted positions, limits, and every resume from a state of this prompt's prefix).

use device_worker::state::planner::{plan, CacheState, PlanConfig, PlanRequest, Policy, Source, Start};
use proptest::prelude::*;

fn cfg(policy: Policy) -> PlanConfig {
    PlanConfig {
        policy,
        checkpoint_bytes: 1000,
        kv_bytes_per_token: 10,
        ..PlanConfig::default()
    }
}

fn seq(start: u32, n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| start + i).collect()
}

/// Plans and applies one request whose output is `out` tokens (fed back except the last).
fn run(state: &mut CacheState, c: &PlanConfig, prompt: &[u32], last_user: Option<usize>, out: usize) -> device_worker::state::planner::Plan {
    let req = PlanRequest { prompt, last_user_start: last_user, image_start: None, image_end: None, line_starts: &[], section_starts: &[] };
    let p = plan(state, &req, c);
    let mut processed = prompt.to_vec();
    processed.extend((0..out.saturating_sub(1) as u32).map(|i| 900_000 + i));
    state.apply(c, &p, &processed);
    p
}

#[test]
fn long_prompt_then_one_sharing_70_tokens_restores_at_or_before_70_or_misses_honestly() {
    for policy in Policy::ALL {
        let c = cfg(policy);
        let mut st = CacheState::default();
        let a = seq(0, 700);
        run(&mut st, &c, &a, None, 14);
        let mut b = a[..70].to_vec();
        b.extend(seq(50_000, 500));
        let p = run(&mut st, &c, &b, None, 14);
        assert_eq!(p.kv_bound, 70);
        assert!(p.resume <= 70, "{policy:?}: resumed at {}", p.resume);
        assert_eq!(p.new_tokens(), b.len() - p.resume);
        match p.start {
            Start::Restore(r) => assert_eq!(r, p.resume),
            Start::Reset => assert_eq!(p.resume, 0),
            Start::Continue => panic!("{policy:?}: cannot continue a slot the prompt left at 70"),
        }
        // The divergence policy saves at 70 now; a third prompt sharing 70 tokens resumes there.
        if policy == Policy::Divergence {
            assert_eq!(p.saved, vec![70]);
            let mut d = a[..70].to_vec();
            d.extend(seq(70_000, 300));
            let p3 = run(&mut st, &c, &d, None, 14);
            assert_eq!((p3.resume, p3.start), (70, Start::Restore(70)));
        }
    }
}

#[test]
fn forty_token_prompt_repeated_with_new_suffix_reuses_its_prefix() {
    for policy in [Policy::Stock, Policy::Divergence] {
        let mut c = cfg(policy);
        // The stock baseline: llama.cpp's batch boundaries (no consolidation).
        c.consolidate = policy != Policy::Stock;
        let mut st = CacheState::default();
        let a = seq(0, 40);
        run(&mut st, &c, &a, None, 5);
        let mut b = a.clone();
        b.extend(seq(10_000, 12));
        let p = run(&mut st, &c, &b, None, 5);
        // stock resumes at its end − 4 checkpoint (36), divergence at the prompt's end (40).
        let want = if policy == Policy::Stock { 36 } else { 40 };
        assert_eq!(p.resume, want, "{policy:?}");
        assert_eq!(p.new_tokens(), b.len() - want);
    }
}

#[test]
fn two_480_token_chat_prompts_sharing_450_reuse_at_least_418() {
    // System message (the rules) then a user message starting at 430; the prompts share the
    // first 20 tokens of the user message.
    for policy in [Policy::Stock, Policy::Divergence] {
        let c = cfg(policy);
        let mut st = CacheState::default();
        let a = seq(0, 480);
        run(&mut st, &c, &a, Some(430), 14);
        let mut b = a[..450].to_vec();
        b.extend(seq(60_000, 32));
        let p = run(&mut st, &c, &b, Some(430), 14);
        assert_eq!(p.kv_bound, 450);
        assert!(p.resume >= 418, "{policy:?}: resumed at {}", p.resume);
        assert_eq!(p.new_tokens(), b.len() - p.resume);
    }
}

#[test]
fn consolidation_runs_600_tokens_as_88_plus_512_and_stock_as_84_512_4() {
    let lens = |p: &device_worker::state::planner::Plan| -> Vec<usize> { p.batches.iter().map(|b| b.end - b.start).collect() };
    let a = seq(0, 600);
    let mut c = cfg(Policy::Stock);
    c.consolidate = false;
    let p = plan(&CacheState::default(), &PlanRequest { prompt: &a, last_user_start: None, image_start: None, image_end: None, line_starts: &[], section_starts: &[] }, &c);
    assert_eq!(lens(&p), vec![84, 512, 4]);
    assert_eq!(p.saved, vec![84, 596]);
    let c = cfg(Policy::Divergence);
    let p = plan(&CacheState::default(), &PlanRequest { prompt: &a, last_user_start: None, image_start: None, image_end: None, line_starts: &[], section_starts: &[] }, &c);
    assert_eq!(lens(&p), vec![88, 512]);
}

#[test]
fn no_checkpoint_at_or_after_an_image() {
    let c = cfg(Policy::Divergence);
    let mut st = CacheState::default();
    let a = seq(0, 300);
    run(&mut st, &c, &a, None, 3);
    let mut b = a[..200].to_vec();
    b.extend(seq(80_000, 100));
    let p = plan(&st, &PlanRequest { prompt: &b, last_user_start: None, image_start: Some(150), image_end: Some(250), line_starts: &[], section_starts: &[] }, &c);
    assert!(p.saved.iter().all(|&s| s < 150), "saved {:?} at or past the image", p.saved);
    // Nothing of the first prompt's checkpoints is left at or before the divergence point
    // (200): the one save is the text right before the image.
    assert_eq!(p.saved, vec![149]);
}

/// `--checkpoint-after-image`: besides the text checkpoint before the image, the state right
/// after the image is saved, and a prompt with the same text and image up to there resumes
/// past the image; off (the default), it resumes before the image.
#[test]
fn the_optional_checkpoint_after_an_image_serves_an_identical_image_prefix() {
    for after_image in [false, true] {
        let c = PlanConfig { after_image, ..cfg(Policy::Divergence) };
        let mut st = CacheState::default();
        // Text 0..100, an image 100..300 (its token ids stand for its content), text after.
        let image = |p: &mut Vec<u32>| p.extend(seq(1 << 31, 200));
        let mut a = seq(0, 100);
        image(&mut a);
        a.extend(seq(5000, 40));
        fn req(p: &[u32]) -> PlanRequest<'_> {
            PlanRequest { prompt: p, last_user_start: Some(60), image_start: Some(100), image_end: Some(300), line_starts: &[], section_starts: &[] }
        }
        let p1 = run_request(&mut st, &c, &req(&a));
        let want: Vec<usize> = if after_image { vec![60, 300] } else { vec![60] };
        assert_eq!(p1.saved, want, "after_image {after_image}");
        // Same text and image, another question after it.
        let mut b = a[..300].to_vec();
        b.extend(seq(9000, 40));
        let p2 = run_request(&mut st, &c, &req(&b));
        assert_eq!(p2.divergence, 300);
        assert_eq!(p2.resume, if after_image { 300 } else { 60 }, "after_image {after_image}");
    }
}

/// A fresh slot whose image is in an earlier message (the last user message starts after
/// it) still saves one text checkpoint before the image: at the start of the image's line
/// (Tandem §4.5), so the next turn resumes there instead of at 0. The stock and Marconi
/// policies are unchanged (they never save in a cold slot without a boundary before it).
#[test]
fn a_cold_slot_saves_before_an_image_in_an_earlier_message() {
    let c = cfg(Policy::Divergence);
    let mut st = CacheState::default();
    // System 0..120, the image's line starts at 120 (its <|vision_start|> at 130, image
    // tokens 131..331), later turns, the last user message at 360.
    let mut a = seq(0, 131);
    a.extend(seq(1 << 31, 200));
    a.extend(seq(5000, 80));
    const LINES: [usize; 5] = [40, 80, 120, 340, 360];
    fn req(p: &[u32]) -> PlanRequest<'_> {
        PlanRequest { prompt: p, last_user_start: Some(360), image_start: Some(131), image_end: Some(331), line_starts: &[], section_starts: &[] }
    }
    fn with_lines(p: &[u32]) -> PlanRequest<'_> {
        PlanRequest { line_starts: &LINES, ..req(p) }
    }
    let p1 = run_request(&mut st, &c, &with_lines(&a));
    assert_eq!(p1.saved, vec![120], "the start of the image's line");
    let mut b = a.clone();
    b.extend(seq(9000, 30));
    let p2 = run_request(&mut st, &c, &with_lines(&b));
    assert_eq!((p2.resume, p2.restored), (120, Some(120)));
    // Without line starts the save goes to the <|vision_start|> token's position.
    let mut st = CacheState::default();
    assert_eq!(run_request(&mut st, &c, &req(&a)).saved, vec![130]);
}

#[test]
fn prompt_cache_serves_an_earlier_episode_after_the_slot_moved_on() {
    let c = cfg(Policy::Divergence);
    let mut st = CacheState::default();
    let ep1 = seq(0, 400);
    run(&mut st, &c, &ep1, Some(300), 10);
    // Another episode takes the slot: the first one's state is stashed.
    let ep2 = seq(100_000, 400);
    let p2 = run(&mut st, &c, &ep2, Some(300), 10);
    assert!(p2.stash_slot);
    assert_eq!(st.prompt_cache.len(), 1);
    // Back to the first episode: its checkpoint at 300 comes from the prompt cache.
    let mut ep1b = ep1[..350].to_vec();
    ep1b.extend(seq(200_000, 40));
    let p3 = run(&mut st, &c, &ep1b, Some(300), 10);
    assert_eq!(p3.source, Source::PromptCache(0));
    assert_eq!(p3.resume, 300);
}

/// Plans and applies `prompt` (with `last_user_start` and line starts) on `st`; its output
/// (`out` tokens, fed back but the last) continues the prompt.
fn run_chat(st: &mut CacheState, c: &PlanConfig, prompt: &[u32], last_user: Option<usize>, lines: &[usize]) -> device_worker::state::planner::Plan {
    run_request(st, c, &PlanRequest { prompt, last_user_start: last_user, image_start: None, image_end: None, line_starts: lines, section_starts: &[] })
}

/// Plans and applies `req` on `st`; two output tokens (fed back but the last) continue it.
fn run_request(st: &mut CacheState, c: &PlanConfig, req: &PlanRequest<'_>) -> device_worker::state::planner::Plan {
    let p = plan(st, req, c);
    let mut processed = req.prompt.to_vec();
    processed.extend([777_000, 777_001]);
    st.apply(c, &p, &processed);
    p
}

#[test]
fn an_identical_prompt_processes_one_token_like_a_kv_cache() {
    // A raw 100-token prompt (no user message, no lines) and a 243-token chat prompt (user
    // message at 180, a line every 9 tokens): sent three times each.
    let lines: Vec<usize> = (9..243).step_by(9).collect();
    for (n, last_user, lines) in [(100, None, &[][..]), (243, Some(180), &lines[..])] {
        for consolidate in [false, true] {
            let mut c = cfg(Policy::Divergence);
            c.consolidate = consolidate;
            let mut st = CacheState::default();
            let a = seq(0, n);
            let first = run_chat(&mut st, &c, &a, last_user, lines);
            assert_eq!(first.end_state, Some(n - 1));
            for repeat in 1..3 {
                let p = run_chat(&mut st, &c, &a, last_user, lines);
                let kv_new = p.n_prompt - p.kv_bound;
                assert_eq!(kv_new, 1);
                assert_eq!((p.resume, p.start), (n - 1, Start::Restore(n - 1)), "repeat {repeat}");
                assert_eq!((p.new_tokens(), p.passes()), (1, 1));
                assert!(p.saved.is_empty() && p.end_state.is_none(), "nothing new to save");
            }
            // Without the end-of-prompt state (no rollback states) a repeat resumes earlier.
            let mut off = c.clone();
            off.end_state = false;
            let mut st = CacheState::default();
            run_chat(&mut st, &off, &a, last_user, lines);
            let p = run_chat(&mut st, &off, &a, last_user, lines);
            assert!(p.new_tokens() > 1, "{n}: {} new tokens without the end state", p.new_tokens());
        }
    }
}

#[test]
fn the_end_of_prompt_state_replaces_the_previous_one_and_adds_no_pass() {
    let c = cfg(Policy::Divergence);
    let mut off = c.clone();
    off.end_state = false;
    let (mut st, mut st_off) = (CacheState::default(), CacheState::default());
    let a = seq(0, 300);
    let mut b = a.clone();
    b.extend(seq(40_000, 80));
    for (i, prompt) in [&a, &b].into_iter().enumerate() {
        let p = run_chat(&mut st, &c, prompt, Some(200), &[]);
        let q = run_chat(&mut st_off, &off, prompt, Some(200), &[]);
        if i == 0 {
            // A cold slot: the same batches (no extra pass or boundary) and policy saves.
            assert_eq!((&p.batches, &p.saved), (&q.batches, &q.saved));
        } else {
            // `b` extends `a`: it resumes at `a`'s end state (299), not at the user message.
            assert_eq!((p.resume, q.resume), (299, 200));
            assert!(p.passes() <= q.passes());
        }
        assert_eq!(p.end_state, Some(prompt.len() - 1));
        let ends: Vec<usize> = st.slot.checkpoints.iter().filter(|cp| cp.end).map(|cp| cp.pos).collect();
        assert_eq!(ends, vec![prompt.len() - 1], "one end-of-prompt state, the newest");
    }
    assert!(!st.slot.checkpoints.iter().any(|cp| cp.pos == 299), "`a`'s end state was replaced");
}

#[test]
fn an_entry_of_another_branch_stays_for_its_episode() {
    let c = cfg(Policy::Divergence);
    let mut st = CacheState::default();
    let rules = seq(0, 300);
    let ep = |k: u32, n: usize| -> Vec<u32> {
        let mut p = rules.clone();
        p.extend(seq(1_000_000 * (k + 1), n));
        p
    };
    run(&mut st, &c, &ep(0, 100), Some(300), 5);
    let mut ep0b = ep(0, 60);
    ep0b.extend(seq(7_000_000, 40));
    run(&mut st, &c, &ep0b, Some(300), 5); // episode 0 saves at its divergence point, 360
    assert!(st.slot.checkpoints.iter().any(|cp| cp.pos == 360));
    // Another slot content takes over (stash), then a third episode resumes from episode 0's
    // entry through the shared rules: the entry stays, the slot gets a copy.
    run(&mut st, &c, &seq(50_000_000, 400), None, 5);
    assert_eq!(st.prompt_cache.len(), 1);
    let p = run(&mut st, &c, &ep(2, 100), Some(300), 5);
    assert_eq!((p.source, p.resume, p.keep_entry), (Source::PromptCache(0), 300, true));
    // Episode 0 comes back: its own entry (still cached) resumes at its checkpoint 360.
    let mut ep0c = ep(0, 60);
    ep0c.extend(seq(8_000_000, 40));
    let p = run(&mut st, &c, &ep0c, Some(300), 5);
    assert!(matches!(p.source, Source::PromptCache(_)));
    assert_eq!(p.resume, 360);
}

// === property test: store invariants, and every resume checked against the cached tokens ===

fn prompt_strategy() -> impl Strategy<Value = Vec<(u8, usize, usize, u8)>> {
    // (family, shared prefix length, suffix length, suffix seed)
    prop::collection::vec((0u8..3, 0usize..700, 1usize..200, any::<u8>()), 1..25)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn store_invariants_hold_over_random_requests(
        reqs in prompt_strategy(),
        policy_i in 0usize..3,
        consolidate in any::<bool>(),
        n_checkpoints in 1usize..9,
        cache_kib in 0usize..40,
    ) {
        let mut c = cfg(Policy::ALL[policy_i]);
        c.consolidate = consolidate;
        c.n_checkpoints = n_checkpoints;
        c.n_batch = 128;
        c.prompt_cache_bytes = cache_kib * 1024;
        let mut st = CacheState::default();
        let families: Vec<Vec<u32>> = (0..3).map(|f| seq(f * 1_000_000, 700)).collect();
        for (f, shared, suffix, s) in reqs {
            let mut prompt = families[f as usize][..shared].to_vec();
            prompt.extend((0..suffix as u32).map(|i| 5_000_000 + s as u32 * 1000 + i));
            let req = PlanRequest { prompt: &prompt, last_user_start: None, image_start: None, image_end: None, line_starts: &[], section_starts: &[] };
            let p = plan(&st, &req, &c);
            let seq_src = match p.source { Source::Slot => &st.slot, Source::PromptCache(i) => &st.prompt_cache[i].seq };
            // Resume only from a state that belongs to position R of this prompt.
            match p.start {
                Start::Continue => prop_assert!(seq_src.tokens.len() == p.resume && prompt[..p.resume] == seq_src.tokens[..]),
                Start::Restore(r) => {
                    prop_assert_eq!(r, p.resume);
                    prop_assert!(seq_src.checkpoints.iter().any(|cp| cp.pos == r));
                    prop_assert!(seq_src.tokens.len() >= r && seq_src.tokens[..r] == prompt[..r]);
                }
                Start::Reset => prop_assert_eq!(p.resume, 0),
            }
            prop_assert!(p.resume <= p.kv_bound && p.kv_bound < prompt.len().max(1));
            // Batches cover R..n contiguously, none longer than n_batch, saves at batch ends.
            let mut pos = p.resume;
            for b in &p.batches {
                prop_assert_eq!(b.start, pos);
                prop_assert!(b.end > b.start && b.end - b.start <= c.n_batch);
                pos = b.end;
            }
            prop_assert_eq!(pos, prompt.len());
            for s in &p.saved {
                prop_assert!(p.batches.iter().any(|b| b.end == *s && b.save));
            }
            if c.policy == Policy::Divergence {
                prop_assert!(p.saved.len() <= 1);
            }
            let processed: Vec<u32> = prompt.clone();
            st.apply(&c, &p, &processed);
            // Invariants: sorted unique positions, count and bytes within limits, every
            // checkpoint inside its sequence.
            prop_assert!(st.slot.checkpoints.windows(2).all(|w| w[0].pos < w[1].pos));
            prop_assert!(st.slot.checkpoints.iter().filter(|cp| !cp.end).count() <= c.n_checkpoints);
            prop_assert!(st.slot.checkpoints.iter().filter(|cp| cp.end).count() <= 1);
            if let Some(e) = p.end_state {
                prop_assert_eq!(e, prompt.len() - 1);
                prop_assert!(st.slot.checkpoints.iter().any(|cp| cp.end && cp.pos == e));
            }
            prop_assert!(st.slot.checkpoints.iter().all(|cp| cp.pos <= st.slot.tokens.len()));
            prop_assert!(st.prompt_cache_bytes(&c) <= c.prompt_cache_bytes);
            for e in &st.prompt_cache {
                prop_assert!(e.seq.checkpoints.windows(2).all(|w| w[0].pos < w[1].pos));
                prop_assert!(e.seq.checkpoints.iter().all(|cp| cp.pos <= e.seq.tokens.len()));
            }
        }
    }
}

/// [`run_chat`] for a prompt without a user message, with paragraph starts.
fn run_sections(st: &mut CacheState, c: &PlanConfig, prompt: &[u32], lines: &[usize], sections: &[usize]) -> device_worker::state::planner::Plan {
    run_request(st, c, &PlanRequest { prompt, last_user_start: None, image_start: None, image_end: None, line_starts: lines, section_starts: sections })
}

#[test]
fn a_cold_one_message_prompt_saves_at_its_last_paragraph_and_the_next_episode_resumes_there() {
    // A one-message agent prompt: 500 tokens of rules, a blank line, then the step's sections.
    let c = cfg(Policy::Divergence);
    let mut st = CacheState::default();
    let lines: Vec<usize> = (10..900).step_by(10).collect();
    let a = seq(0, 900);
    let p = run_sections(&mut st, &c, &a, &lines, &[200, 500]);
    assert_eq!(p.saved, vec![500], "the last paragraph start, not n - n_batch (388) or n");
    // Another episode sharing the rules and 3 tokens of its task line resumes at the rules' end.
    let mut b = a[..503].to_vec();
    b.extend(seq(60_000, 400));
    let p2 = run_sections(&mut st, &c, &b, &lines, &[200, 500]);
    assert_eq!((p2.kv_bound, p2.resume), (503, 500));
}

#[test]
fn a_line_start_too_close_to_the_resume_point_saves_at_the_divergence_point_itself() {
    let c = cfg(Policy::Divergence);
    let mut st = CacheState::default();
    let lines: Vec<usize> = vec![100, 110, 140, 300];
    let a = seq(0, 400);
    assert_eq!(run_sections(&mut st, &c, &a, &lines, &[]).saved.len(), 1);
    // A second prompt leaves the first at 105: whatever it resumes from, it leaves one
    // checkpoint (`base`) at or before 105.
    let mut b = a[..105].to_vec();
    b.extend(seq(10_000, 295));
    let pb = run_sections(&mut st, &c, &b, &lines, &[]);
    assert!(pb.resume <= 105);
    let mut st2 = st.clone();
    let base = pb.saved.first().copied().unwrap_or(pb.resume);
    // A prompt diverging `min_gap + 5` tokens past that checkpoint, mid-line, its line start
    // only 5 tokens past it: saved at the divergence point.
    let l = base + c.min_gap + 5;
    let lines2: Vec<usize> = vec![base + 5, base + c.min_gap + 40];
    let mut d = b[..l].to_vec();
    d.extend(seq(20_000, 200));
    let pd = run_sections(&mut st2, &c, &d, &lines2, &[]);
    assert_eq!(pd.resume, base);
    assert_eq!(pd.saved, vec![l]);
}

#[test]
fn a_recurring_divergence_point_at_a_line_start_is_saved_at_half_the_min_gap() {
    let c = cfg(Policy::Divergence);
    let gap = c.min_gap / 2 + 1; // under min_gap, at least half of it
    assert!(gap < c.min_gap);
    let mut st = CacheState::default();
    let base = seq(0, 300);
    // Cold: a checkpoint at the last paragraph, 200.
    assert_eq!(run_sections(&mut st, &c, &base, &[200, 200 + gap], &[200]).saved, vec![200]);
    let lines = [200, 200 + gap];
    let step = |st: &mut CacheState, k: u32| {
        let mut p = base[..200 + gap].to_vec();
        p.extend(seq(1_000 * (k + 1), 100));
        run_sections(st, &c, &p, &lines, &[200])
    };
    // The first divergence at 200 + gap is not worth a save; the same point again is.
    let p1 = step(&mut st, 1);
    assert_eq!((p1.resume, p1.divergence), (200, 200 + gap));
    assert!(p1.saved.is_empty(), "{:?}", p1.saved);
    let p2 = step(&mut st, 2);
    assert_eq!(p2.saved, vec![200 + gap]);
    let p3 = step(&mut st, 3);
    assert_eq!(p3.resume, 200 + gap);
}
