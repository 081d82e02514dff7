//! The dry-run planner: a pure function of (cached state, request, configuration) that says
//! which tokens a request processes, in which batches, and which checkpoints it restores,
//! saves and evicts — without running the model. The engine executes exactly this plan, so
//! `tandem-tools dry-run` predicts the engine's token counts exactly (Tandem §4.2: "the model
//! reproduces 422/422 measured prompt-token counts").
//!
//! Rules (Tandem §2.4, §4.2; llama.cpp server `update_slots`):
//! - `L` = longest common prefix of the prompt with the slot's tokens or a prompt-cache entry;
//!   the reusable length is capped at `n − 1` so the last prompt token is always processed
//!   (its logits start decoding). `kv_bound` = that capped `L`: what a KV cache would reuse.
//! - A hybrid model resumes at `R` ≤ `L`: the live state when the whole cached sequence is a
//!   prefix of the prompt (and no longer than the cap), else the newest checkpoint at or before
//!   the cap, else 0. Never from a state that does not belong to position `R`.
//! - Checkpoints past `L` belong to a branch the prompt left and are dropped.
//! - Saves and batch boundaries per [`Policy`] and [`PlanConfig::consolidate`]; every save
//!   ends a batch; no batch exceeds `n_batch`.
//! - The end-of-prompt state (divergence policy, [`PlanConfig::end_state`]): the state after
//!   `n − 1` tokens, taken from the rollback states of the last batch (no extra pass, no extra
//!   batch boundary; `state/rollback.rs`), so an identical prompt resumes at `n − 1` and
//!   processes 1 token, as a KV cache would. It replaces the slot's previous one.

use super::policy::{PlanConfig, Policy, STOCK_FAR, STOCK_NEAR};
use super::meta::{CacheState, CachedSequence, CheckpointMeta};
use crate::state::slot::common_prefix;

/// The request as the planner sees it.
#[derive(Clone, Copy, Debug)]
pub struct PlanRequest<'a> {
    pub prompt: &'a [u32],
    /// Token position where the last user message starts (chat prompts; stock saves there).
    pub last_user_start: Option<usize>,
    /// Position of the first image token, if the prompt has an image (no checkpoint at or
    /// after it: Tandem §4.2).
    pub image_start: Option<usize>,
    /// One past the last token of the prompt's last image, if any (the optional save right
    /// after it, [`PlanConfig::after_image`]).
    pub image_end: Option<usize>,
    /// Positions that start a line (the token before ends with a newline), ascending. The
    /// divergence policy saves at the line start at or before `L` (empty: at `L` itself).
    pub line_starts: &'a [usize],
    /// Positions that start a paragraph (a line after an empty line), ascending
    /// (`crate::prompt::section_starts`). Without a user-message boundary, the divergence
    /// policy's one save in a cold slot goes to the last one (the sections before it — the
    /// rules of a one-message agent prompt — are what the next prompts share).
    pub section_starts: &'a [usize],
}

/// Where the reused prefix comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// The slot's own cached sequence.
    Slot,
    /// Entry `i` of the prompt cache (the slot's content is stashed there first).
    PromptCache(usize),
}

/// How processing starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Start {
    /// Continue from the live state (truncating the KV cache to `resume` for a model without
    /// recurrent layers).
    Continue,
    /// Restore the checkpoint at this position and truncate the KV cache there.
    Restore(usize),
    /// Empty state: process the whole prompt.
    Reset,
}

/// One forward pass over prompt positions `start..end`; `save`: save a checkpoint after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Batch {
    pub start: usize,
    pub end: usize,
    pub save: bool,
}

/// What a request will do. Positions are token counts from the prompt's start.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Plan {
    pub n_prompt: usize,
    /// Tokens a KV cache would reuse (`min(L, n − 1)`).
    pub kv_bound: usize,
    /// `L`: the prompt's common prefix with the sequence it resumes from (the divergence
    /// point; the next request on the slot compares its own with it).
    pub divergence: usize,
    pub source: Source,
    /// The slot's content goes to the prompt cache before this request (the slot serves a
    /// prompt it does not share the best prefix with).
    pub stash_slot: bool,
    /// The prompt-cache entry resumed from stays in the cache (the slot gets a copy): the
    /// prompt leaves the entry's sequence before its end (`L` < its length), so the entry is
    /// another branch — another episode's content, whose owner may come back for it.
    pub keep_entry: bool,
    pub start: Start,
    /// `R`: prompt tokens reused (not processed).
    pub resume: usize,
    pub batches: Vec<Batch>,
    /// Checkpoint positions saved (each the end of a batch).
    pub saved: Vec<usize>,
    /// Checkpoint position restored, if any.
    pub restored: Option<usize>,
    /// Checkpoints evicted for capacity.
    pub evicted: Vec<usize>,
    /// Checkpoints dropped because they lie past `L` (a branch the prompt left).
    pub dropped: Vec<usize>,
    /// The end-of-prompt state saved (`n − 1`, from the last batch's rollback states; or the
    /// live state before the last batch when that batch starts there), if any.
    pub end_state: Option<usize>,
}

impl Plan {
    /// Prompt tokens processed (`n − R`).
    pub fn new_tokens(&self) -> usize {
        self.n_prompt - self.resume
    }

    /// Forward passes of the prefill.
    pub fn passes(&self) -> usize {
        self.batches.len()
    }
}

/// Plans `req` on `state` under `cfg`. Pure: the same inputs always give the same plan.
///
/// Panics never; an empty prompt gives a plan with no batches.
pub fn plan(state: &CacheState, req: &PlanRequest<'_>, cfg: &PlanConfig) -> Plan {
    let n = req.prompt.len();
    let cap = n.saturating_sub(1);

    // Reuse from the slot, or from a prompt-cache entry when that resumes later.
    let (slot_l, slot_r) = reuse(&state.slot, req.prompt, cap, cfg);
    let mut source = Source::Slot;
    let (mut l, mut r) = slot_l;
    let mut r_start = slot_r;
    let mut kv_bound = l.min(cap);
    if cfg.prompt_cache_bytes > 0 {
        for (i, e) in state.prompt_cache.iter().enumerate() {
            let ((el, er), estart) = reuse(&e.seq, req.prompt, cap, cfg);
            kv_bound = kv_bound.max(el.min(cap));
            // Among entries resuming equally late, the one sharing the longest prefix (its
            // branch is the prompt's: the divergence point, and the next save, come later).
            let longer = er == r && el > l && source != Source::Slot;
            if er > r || longer {
                (source, l, r, r_start) = (Source::PromptCache(i), el, er, estart);
            }
        }
    }
    let seq: &CachedSequence = match source {
        Source::Slot => &state.slot,
        Source::PromptCache(i) => &state.prompt_cache[i].seq,
    };
    // Stash the slot when the request moves it to another prefix: it came from the cache, or
    // the slot holds a sequence the prompt diverges from early (nothing reusable).
    let keep_entry = source != Source::Slot && l < seq.tokens.len();
    let stash_slot = cfg.prompt_cache_bytes > 0
        && !state.slot.tokens.is_empty()
        && (source != Source::Slot || (r == 0 && l < state.slot.tokens.len()));

    // The checkpoints that remain once the request starts and those past L, dropped (after a
    // stash the slot starts empty: nothing is kept or dropped).
    let (kept, past_l): (Vec<CheckpointMeta>, Vec<CheckpointMeta>) = if stash_slot && source == Source::Slot {
        (Vec::new(), Vec::new())
    } else {
        seq.checkpoints.iter().partition(|c| c.pos <= l)
    };
    let dropped: Vec<usize> = past_l.iter().map(|c| c.pos).collect();
    let restored = match r_start {
        Start::Restore(p) => Some(p),
        _ => None,
    };

    let recurring = seq.last_divergence == Some(l);
    let saves = saves(req, cfg, (l, r), recurring, &kept);
    let end_state = end_state(req, cfg, r, &saves);

    // Batch boundaries: saves, plus the micro-batch splitting.
    let batches = if n > r {
        batches(r, n, &saves, cfg)
    } else {
        Vec::new()
    };

    let mut evicted = evict_after_saves(state, &kept, &saves, restored, cfg);
    if end_state.is_some() {
        // The new end-of-prompt state replaces the previous one.
        evicted.extend(kept.iter().filter(|c| c.end).map(|c| c.pos));
        evicted.sort_unstable();
    }

    Plan {
        n_prompt: n,
        kv_bound,
        divergence: l,
        source,
        stash_slot,
        keep_entry,
        start: if n == 0 { Start::Continue } else { r_start },
        resume: r,
        batches,
        saved: saves,
        restored,
        evicted,
        dropped,
        end_state,
    }
}

/// The end-of-prompt position `n − 1` when the request saves it (divergence policy with
/// [`PlanConfig::end_state`] on a hybrid model): something before it is processed (`n − 1 >
/// r`), it is before any image, and no save of the policy is already there.
fn end_state(req: &PlanRequest<'_>, cfg: &PlanConfig, r: usize, saves: &[usize]) -> Option<usize> {
    let e = req.prompt.len().checked_sub(1)?;
    let on = cfg.hybrid && cfg.end_state && cfg.policy == Policy::Divergence;
    let before_image = req.image_start.is_none_or(|i| e < i);
    (on && e > r && before_image && !saves.contains(&e)).then_some(e)
}

/// The positions the request saves a checkpoint at, by policy (DESIGN.md "Cross-request
/// reuse"): `l` is the divergence point (longest common prefix), `r` the resume point,
/// `recurring` whether the previous request on this sequence diverged at `l` too, `kept` the
/// checkpoints still held once the request starts. Sorted, unique; none for an
/// attention-only model.
fn saves(
    req: &PlanRequest<'_>,
    cfg: &PlanConfig,
    (l, r): (usize, usize),
    recurring: bool,
    kept: &[CheckpointMeta],
) -> Vec<usize> {
    let n = req.prompt.len();
    let mut saves: Vec<usize> = Vec::new();
    if cfg.hybrid && n > 0 {
        let before_image = |p: usize| req.image_start.is_none_or(|i| p < i);
        match cfg.policy {
            Policy::Stock => {
                let mut cand = Vec::new();
                if cfg.consolidate {
                    cand.push(n.checked_sub(cfg.n_batch));
                } else {
                    cand.push(n.checked_sub(STOCK_FAR));
                    cand.push(n.checked_sub(STOCK_NEAR));
                }
                cand.push(req.last_user_start);
                saves.extend(cand.into_iter().flatten().filter(|&p| p > r && p < n));
            }
            Policy::Marconi => {
                if l > r && l < n && before_image(l) {
                    saves.push(l);
                }
                if before_image(n) {
                    saves.push(n);
                }
            }
            Policy::Divergence => {
                // Consecutive prompts diverge inside a field (a history entry, a control
                // line), a few tokens apart from one request to the next; the start of that
                // line is what the next request most likely still shares.
                // A save is worth its batch boundary `min_gap` tokens past the resume point,
                // or half that at a recurring divergence point that starts a line (the
                // previous request on this sequence diverged there too: a sliding history's
                // first entry, a field that keeps changing). When the line start is too close
                // to be worth it, the divergence point itself may still be (the next prompt
                // often shares the same partial line: an app name that changes in its last
                // component).
                let line = snap_to_line(l, req.line_starts);
                let gap = if recurring && line == l { cfg.min_gap / 2 } else { cfg.min_gap };
                let worth = |p: usize| p > r && p - r >= gap;
                let at = if worth(line) { line } else { l };
                if worth(at) && at < n && before_image(at) {
                    saves.push(at);
                } else if kept.iter().all(|c| c.end) {
                    // A cold slot has no divergence point yet: leave one resumable state, at
                    // the start of the last user message (the rules that later steps share),
                    // else at the start of the prompt's last paragraph (a one-message prompt's
                    // shared rules end there), else, when the end-of-prompt state already
                    // covers a repeat, one micro-batch before the prompt's end at a line start
                    // (where the stock server's consolidated checkpoint sits), else at the
                    // prompt's end (a repeat with a new suffix resumes there). Still at most
                    // one new checkpoint per request. Every candidate lies before the first
                    // image (Tandem §4.5: the text checkpoint before the image); when the
                    // last user message starts past it (the image is in an earlier message),
                    // the save goes to the start of the image's line, so the next step
                    // resumes with all the text before the image.
                    let usable =
                        |p: &usize| *p > r && *p < n && *p - r >= cfg.min_gap && before_image(*p);
                    let section = req.section_starts.iter().rev().copied().find(|p| usable(p));
                    let image_line = req
                        .image_start
                        .map(|i| snap_to_line(i.saturating_sub(1), req.line_starts))
                        .filter(usable);
                    let early = n
                        .checked_sub(cfg.n_batch)
                        .map(|p| snap_to_line(p, req.line_starts))
                        .filter(|&p| cfg.end_state && p > r && p - r >= cfg.min_gap);
                    let p = req
                        .last_user_start
                        .filter(usable)
                        .or(image_line)
                        .or(section)
                        .or(early)
                        .unwrap_or(n);
                    if before_image(p) && p > r && p - r >= cfg.min_gap {
                        saves.push(p);
                    }
                }
            }
        }
        if let Some(e) = req.image_end.filter(|&e| cfg.after_image && e > r && e < n) {
            saves.push(e);
        }
        saves.sort_unstable();
        saves.dedup();
        // Reuse an existing copy instead of saving it again (consolidation; without it the
        // stock server re-saves a restored position).
        if cfg.consolidate {
            saves.retain(|p| !kept.iter().any(|c| c.pos == *p));
        }
    }
    saves
}

/// The checkpoints evicted once `saves` are in: `kept` plus the new ones, the saved and the
/// restored position marked used now, then the policy's eviction ([`evict`]).
fn evict_after_saves(
    state: &CacheState,
    kept: &[CheckpointMeta],
    saves: &[usize],
    restored: Option<usize>,
    cfg: &PlanConfig,
) -> Vec<usize> {
    let mut after: Vec<CheckpointMeta> = kept.to_vec();
    let now = state.clock + 1;
    for &p in saves {
        match after.iter_mut().find(|c| c.pos == p) {
            Some(c) => c.last_used = now,
            None => after.push(CheckpointMeta {
                pos: p,
                created: now,
                last_used: now,
                end: false,
            }),
        }
    }
    if let Some(rp) = restored {
        if let Some(c) = after.iter_mut().find(|c| c.pos == rp) {
            c.last_used = now;
        }
    }
    evict(&mut after, cfg)
}

/// The last line start at or before `l`, or `l` when the prompt has no line information.
fn snap_to_line(l: usize, line_starts: &[usize]) -> usize {
    if line_starts.is_empty() {
        return l;
    }
    match line_starts.partition_point(|&p| p <= l) {
        0 => l,
        i => line_starts[i - 1],
    }
}

/// `R`: where `prompt` could resume from `seq` under `cfg` (the prompt's tokens `seq` holds a
/// usable state for, at most `n − 1`): what a slot or prompt-cache entry offers a request.
pub fn resume_point(seq: &CachedSequence, prompt: &[u32], cfg: &PlanConfig) -> usize {
    reuse(seq, prompt, prompt.len().saturating_sub(1), cfg).0 .1
}

/// `((L, R), start)` for resuming `prompt` from `seq`: `L` the common prefix, `R` where
/// processing can resume (≤ `cap`).
fn reuse(
    seq: &CachedSequence,
    prompt: &[u32],
    cap: usize,
    cfg: &PlanConfig,
) -> ((usize, usize), Start) {
    let l = common_prefix(&seq.tokens, prompt);
    if !cfg.hybrid {
        let r = l.min(cap);
        return ((l, r), if r > 0 { Start::Continue } else { Start::Reset });
    }
    if seq.tokens.len() == l && l <= cap && l > 0 {
        return ((l, l), Start::Continue);
    }
    match seq.checkpoint_at_or_before(l.min(cap)) {
        Some(c) if c.pos > 0 => ((l, c.pos), Start::Restore(c.pos)),
        _ => ((l, 0), Start::Reset),
    }
}

/// Batches covering `r..n`, ending at every save and never longer than `n_batch`.
/// Consolidated: the segment after the last save is cut from its end (full batches last), so
/// 600 tokens run as 88 + 512. Stock: forward cuts at `n − 516` and `n − 4` too.
fn batches(r: usize, n: usize, saves: &[usize], cfg: &PlanConfig) -> Vec<Batch> {
    let nb = cfg.n_batch.max(1);
    let mut cuts: Vec<usize> = saves.iter().copied().filter(|&p| p > r && p < n).collect();
    if !cfg.consolidate && cfg.hybrid {
        for d in [STOCK_FAR, STOCK_NEAR] {
            if let Some(p) = n.checked_sub(d) {
                if p > r && p < n {
                    cuts.push(p);
                }
            }
        }
    }
    cuts.push(n);
    cuts.sort_unstable();
    cuts.dedup();
    let mut out = Vec::new();
    let mut s = r;
    for (ci, &e) in cuts.iter().enumerate() {
        let save = saves.contains(&e);
        let len = e - s;
        let k = len.div_ceil(nb).max(1);
        if cfg.consolidate && ci == cuts.len() - 1 {
            // Last segment, cut from the end: remainder first, then full batches.
            let first = len - (k - 1) * nb;
            let mut b = s;
            for j in 0..k {
                let end = if j == 0 { b + first } else { b + nb };
                out.push(Batch { start: b, end, save: false });
                b = end;
            }
        } else {
            let mut b = s;
            while b < e {
                let end = (b + nb).min(e);
                out.push(Batch { start: b, end, save: false });
                b = end;
            }
        }
        if let Some(last) = out.last_mut() {
            last.save = save;
        }
        s = e;
    }
    out
}

/// Removes checkpoints beyond `n_checkpoints` and returns their positions: oldest created
/// first (stock, divergence: llama.cpp's server), or lowest utility (marconi: recency rank
/// plus compute saved per byte, both normalised to 0..1). The end-of-prompt state is not
/// counted (it is replaced by the next one instead).
fn evict(cps: &mut Vec<CheckpointMeta>, cfg: &PlanConfig) -> Vec<usize> {
    cps.retain(|c| !c.end);
    let mut out = Vec::new();
    while cps.len() > cfg.n_checkpoints {
        let i = match cfg.policy {
            Policy::Marconi => {
                let max_pos = cps.iter().map(|c| c.pos).max().unwrap_or(1).max(1) as f64;
                let (lo, hi) = (
                    cps.iter().map(|c| c.last_used).min().unwrap_or(0),
                    cps.iter().map(|c| c.last_used).max().unwrap_or(0),
                );
                let span = (hi - lo).max(1) as f64;
                let util = |c: &CheckpointMeta| {
                    (c.last_used - lo) as f64 / span + c.pos as f64 / max_pos
                };
                (0..cps.len())
                    .min_by(|&a, &b| util(&cps[a]).total_cmp(&util(&cps[b])).then(a.cmp(&b)))
                    .unwrap_or(0)
            }
            Policy::Stock | Policy::Divergence => (0..cps.len())
                .min_by_key(|&i| (cps[i].created, cps[i].pos))
                .unwrap_or(0),
        };
        out.push(cps.remove(i).pos);
    }
    out.sort_unstable();
    out
}
