//! `device-worker bench`: prefill and decode speed on a model, measured the way
//! `llama-bench` does (pp: a prompt of N tokens in micro-batches; tg: N tokens decoded one at
//! a time), so `bench/compare.sh` can put both side by side in one run.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use dsp::pool::ThreadPool;

use crate::config::defaults as d;
use crate::speculative::pass_tokens;
use crate::config::at_least_one;
use crate::model::op_profile::OpProfile;
use gguf::reader::GgufFile;
use crate::model::Model;
use crate::state::sequence::SequenceState;

/// Times [`crate::model::vision::Projector::encode`] of `image`: one untimed-for-the-mean
/// first encode (reported as `first_ms`: it pages in the weights), then `reps` timed encodes.
/// Preprocessing (decode, resize to the `budget`, patching) is outside the timing, as
/// llama.cpp's `mtmd_encode_chunk` excludes it. Prints the sizes and times to stderr and
/// returns them as JSON (`encode_ms` = mean of `encode_ms_runs`, milliseconds).
///
/// Errors: the image cannot be read or preprocessed, or the encode fails.
fn encode_image(
    projector: &crate::model::vision::Projector,
    pool: &ThreadPool,
    image: &std::path::Path,
    budget: crate::model::vision::ImageBudget,
    reps: usize,
) -> anyhow::Result<serde_json::Value> {
    use crate::model::vision::{preprocess::preprocess, EncodeOptions, PreprocessOptions};
    let bytes = std::fs::read(image).with_context(|| format!("reading {}", image.display()))?;
    let pre = preprocess(&bytes, &projector.config, &PreprocessOptions { budget, ..Default::default() })
        .with_context(|| format!("image {}", image.display()))?;
    let opts = EncodeOptions::default();
    let timed = |pool: &ThreadPool| -> anyhow::Result<f64> {
        let start = Instant::now();
        projector.encode(pool, &pre, &opts).with_context(|| format!("encoding {}", image.display()))?;
        Ok(start.elapsed().as_secs_f64() * 1e3)
    };
    let first_ms = timed(pool)?;
    let runs = (0..reps).map(|_| timed(pool)).collect::<anyhow::Result<Vec<f64>>>()?;
    let ms = mean(&runs);
    eprintln!(
        "image {}: {}x{} -> {}x{}, {} tokens ({} patches): encode {ms:.2} ms (mean of {reps}; runs {runs:.1?}, first {first_ms:.1})",
        image.display(),
        pre.source_size.0,
        pre.source_size.1,
        pre.size.0,
        pre.size.1,
        pre.n_tokens,
        pre.grid_thw.1 * pre.grid_thw.2
    );
    Ok(serde_json::json!({
        "image": image.display().to_string(),
        "source_size": [pre.source_size.0, pre.source_size.1],
        "size": [pre.size.0, pre.size.1],
        "n_tokens": pre.n_tokens,
        "n_patches": pre.grid_thw.1 * pre.grid_thw.2,
        "threads": pool.n_threads(),
        "encode_ms": ms,
        "encode_ms_runs": runs,
        "first_ms": first_ms,
    }))
}

/// `device-worker bench`'s options.
#[derive(Clone, Debug, clap::Args)]
pub struct BenchOptions {
    /// GGUF model file. Default: the fetched SmolLM2-135M-Instruct Q4_1.
    #[arg(long, env = "TANDEM_MODEL")]
    pub model: Option<PathBuf>,
    /// Vision projector GGUF (`--mmproj`, as `serve`): loaded and checked against the model;
    /// its size is reported, and with `--image` the encoder is timed.
    #[arg(long, env = "TANDEM_MMPROJ")]
    pub mmproj: Option<PathBuf>,
    /// A PNG or JPEG image to encode with `--mmproj` (default preprocessing and llama.cpp's
    /// encoder choices): its size, token count and the mean time of one encode over
    /// `--repetitions` are printed to stderr. One more, untimed-for-the-mean encode runs first
    /// (it pages in the weights; reported as `first`), so `-r 1` encodes twice.
    #[arg(long, requires = "mmproj")]
    pub image: Option<PathBuf>,
    /// Fewest image tokens for `--image` (as `serve`'s, llama.cpp's `--image-min-tokens`).
    #[arg(long, default_value_t = crate::model::vision::preprocess::DEFAULT_MIN_TOKENS, value_parser = at_least_one)]
    pub image_min_tokens: usize,
    /// Most image tokens for `--image` (as `serve`'s, llama.cpp's `--image-max-tokens`):
    /// a larger image is downscaled to fit, so the encoder's cost follows this.
    #[arg(long, default_value_t = crate::model::vision::preprocess::DEFAULT_MAX_TOKENS, value_parser = at_least_one)]
    pub image_max_tokens: usize,
    /// With `--image`: time only the encoder and skip pp/tg (with `--json`, one object with
    /// `encode_ms`, `encode_ms_runs`, `first_ms`, `n_tokens`, sizes). `bench/vision_encode.py`
    /// uses it against `llama-mtmd-cli`.
    #[arg(long, requires = "image")]
    pub encode_only: bool,
    /// Compute threads. Default: every core, as `serve` (the peer comparisons in bench/ pass
    /// 1 and 2).
    #[arg(long, short = 't', value_parser = at_least_one)]
    pub threads: Option<usize>,
    #[command(flatten)]
    pub kernels: crate::config::KernelArgs,
    /// Prompt tokens for the prefill test (pp).
    #[arg(long, default_value_t = 512, value_parser = at_least_one)]
    pub prompt_tokens: usize,
    /// Tokens for the decode test (tg).
    #[arg(long, default_value_t = 64, value_parser = at_least_one)]
    pub gen_tokens: usize,
    /// Also measure pp and tg with this many tokens already in the KV cache (and recurrent
    /// state) before the timed part, as llama-bench's `-d`: an agent step prefills its new
    /// tokens after a reused prefix, so prefill at depth is what a step costs. 0: only the
    /// depth-0 figures.
    #[arg(long, default_value_t = 0)]
    pub depth: usize,
    /// Micro-batch size.
    #[arg(long, default_value_t = d::MICRO_BATCH, value_parser = at_least_one)]
    pub micro_batch: usize,
    /// Repetitions (the mean is reported).
    #[arg(long, short = 'r', default_value_t = 3, value_parser = at_least_one)]
    pub repetitions: usize,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Also time each operation of the prefill runs and of the decode runs and print a table
    /// for each (op, ms per run, share of the time); with --json, as the `prefill_profile` and
    /// `decode_profile` arrays. With --depth, the runs at that depth are profiled (and decode
    /// at depth 0 as well, `decode_profile_depth0`). The decode table adds the token choice
    /// (`sampling (argmax)`) and the time outside the passes and the choice (`between passes`).
    /// With --mtp-overhead: one table for the decode passes and one for the verification
    /// passes (`pass_profiles` with --json), timed in extra rounds after the timed ones.
    #[arg(long)]
    pub profile: bool,
    /// Instead of pp/tg: prefill the prompt plain (chunked GDN, no rollback states), with a
    /// rollback-aware prefill keeping --rollback-k states, and with the per-token prefill
    /// keeping them (llama.cpp's way), the three interleaved per repetition; prints tokens/s
    /// and the ratios to plain (speculative decoding's prefill overhead, Tandem §3.3).
    #[arg(long, group = "n_draft_runs")]
    pub rollback_ablation: bool,
    /// Rollback states kept per pass in --rollback-ablation (default: n_draft + 1, the
    /// verification pass of --n-draft drafts), at most the prompt and the micro-batch.
    #[arg(long, requires = "rollback_ablation", value_parser = at_least_one)]
    pub rollback_k: Option<usize>,
    /// Instead of pp/tg, on a Qwen3.5 model with an MTP block: (a) prefill tokens/s without
    /// and with filling the MTP KV cache, (b) one verification pass of 1 + --n-draft tokens
    /// vs one decode pass, (c) ms per MTP draft token, full vocabulary and (when the file has
    /// one) trimmed head; --gen-tokens rounds for (b) and (c).
    #[arg(long, group = "n_draft_runs")]
    pub mtp_overhead: bool,
    /// Drafts per verification pass, 1..=8 as `serve --n-draft`: with --mtp-overhead, or
    /// with --rollback-ablation (which keeps n_draft + 1 rollback states unless --rollback-k
    /// is given); the other runs have no drafts.
    #[arg(long, default_value_t = d::N_DRAFT, value_parser = crate::config::n_draft(), requires = "n_draft_runs")]
    pub n_draft: u32,
}

impl BenchOptions {
    /// `--threads`, or every core of this machine.
    pub fn n_threads(&self) -> usize {
        crate::config::threads_or_all_cores(self.threads)
    }

    /// The usage checks clap cannot make, before anything is read: the image-token budget,
    /// off its defaults only with `--mmproj` (as `serve`), and the rollback states of
    /// `--rollback-ablation` within the prompt and the micro-batch.
    ///
    /// Errors: [`crate::config::ConfigError`] naming the option.
    pub fn check_usage(&self) -> Result<(), crate::config::ConfigError> {
        crate::config::check_image_budget_usage(self.mmproj.is_some(), self.image_min_tokens, self.image_max_tokens)?;
        let (k, n_batch) = (self.rollback_states(), self.n_batch());
        if !self.rollback_ablation || k <= n_batch {
            return Ok(());
        }
        let batch = format!("--prompt-tokens {}, --micro-batch {}", self.prompt_tokens, self.micro_batch);
        Err(match self.rollback_k {
            Some(_) => crate::config::ConfigError {
                option: "rollback-k",
                value: format!("{k} ({batch})"),
                reason: "must be at most the prompt and the micro-batch length",
            },
            None => crate::config::ConfigError {
                option: "n-draft",
                value: format!("{} (--rollback-ablation keeps n_draft + 1 = {k} rollback states; {batch})", self.n_draft),
                reason: "the rollback states must fit the prompt and the micro-batch: lower --n-draft or set --rollback-k",
            },
        })
    }

    /// Drafts per verification pass (`--n-draft`).
    pub fn drafts(&self) -> usize {
        self.n_draft as usize
    }

    /// The prefill micro-batch of the runs: `--micro-batch`, at most the prompt.
    pub fn n_batch(&self) -> usize {
        self.micro_batch.clamp(1, self.prompt_tokens.max(1))
    }

    /// Rollback states kept per pass by `--rollback-ablation`: `--rollback-k`, else the
    /// verification pass of `--n-draft` drafts.
    pub fn rollback_states(&self) -> usize {
        self.rollback_k.unwrap_or(pass_tokens(self.drafts()))
    }

    /// The context the runs fill: `--depth`, the prompt, the decode runs (after the prompt
    /// too; `--mtp-overhead` rounds grow the sequence by up to `1 + n_draft` tokens each),
    /// the drafts of a verification pass and a few warm-up tokens.
    pub fn n_ctx(&self) -> usize {
        let per_round = pass_tokens(self.drafts()).max(2);
        [self.prompt_tokens, per_round.saturating_mul(self.gen_tokens), self.drafts(), 8]
            .into_iter()
            .fold(self.depth, usize::saturating_add)
    }

    /// Refuses runs that do not fit the model's trained context (`n_ctx_train`), before the
    /// sequence state for them is allocated.
    ///
    /// Errors: [`crate::config::ConfigError`] naming `--prompt-tokens` and both sizes.
    pub fn check_context(&self, n_ctx_train: usize) -> Result<(), crate::config::ConfigError> {
        if self.n_ctx() <= n_ctx_train {
            return Ok(());
        }
        Err(crate::config::ConfigError {
            option: "prompt-tokens",
            value: format!(
                "{} (with --depth {} and --gen-tokens {} the runs need a context of {} tokens; the model's context size is {})",
                self.prompt_tokens,
                self.depth,
                self.gen_tokens,
                self.n_ctx(),
                n_ctx_train
            ),
            reason: "lower --prompt-tokens, --depth or --gen-tokens to fit",
        })
    }
}

/// Runs the benchmark and prints the result.
pub fn run(cfg: &BenchOptions) -> anyhow::Result<()> {
    cfg.kernels.install().map_err(anyhow::Error::msg)?;
    let path = cfg
        .model
        .clone()
        .unwrap_or_else(crate::config::default_model_path);
    let mut inputs = vec![("--model", path.as_path())];
    inputs.extend(cfg.mmproj.as_deref().map(|p| ("--mmproj", p)));
    tandem_options::exit_on_usage_error(tandem_options::check_readable(&inputs));
    let file = Arc::new(GgufFile::open(&path)?);
    let header = crate::config::ModelHeader::read(&file)?;
    tandem_options::exit_on_usage_error(cfg.check_context(header.n_ctx_train));
    let mut model = Model::load(file)?;
    let pool = ThreadPool::new(cfg.n_threads())?;
    if let Some(p) = &cfg.mmproj {
        let projector = crate::model::vision::Projector::open(p, model.n_embd())
            .with_context(|| format!("loading the projector {}", p.display()))?;
        let c = &projector.config;
        eprintln!(
            "projector {}: {} parameters; {} layers, width {}, {} heads, patch {} px, merge {}x{}, output {}",
            p.display(),
            projector.n_params(),
            c.n_layer,
            c.n_embd,
            c.n_head,
            c.patch_size,
            c.spatial_merge,
            c.spatial_merge,
            c.projection_dim
        );
        if let Some(image) = &cfg.image {
            let budget = crate::config::image_budget(cfg.image_min_tokens, cfg.image_max_tokens)?;
            let result = encode_image(&projector, &pool, image, budget, cfg.repetitions.max(1))?;
            if cfg.encode_only {
                if cfg.json {
                    tandem_options::write_stdout(|out| writeln!(out, "{result}"))?;
                }
                return Ok(());
            }
        }
    }
    let mut seq = model.new_sequence_state(cfg.n_ctx());
    let n_batch = cfg.n_batch();
    // Buffers for a prefill micro-batch, the warm-up below and a verification pass of
    // 1 + n_draft tokens (--mtp-overhead), whichever is largest.
    model.set_max_batch(n_batch.max(8).max(pass_tokens(cfg.drafts())));
    // Deterministic pseudo-random token ids, as llama-bench uses random tokens.
    let n_vocab = model.n_vocab() as u64;
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut next_id = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % n_vocab) as u32
    };
    let prompt: Vec<u32> = (0..cfg.prompt_tokens).map(|_| next_id()).collect();
    let reps = cfg.repetitions.max(1);

    // Warm-up (page in the weights).
    model.forward(
        &pool,
        &mut seq,
        &prompt[..prompt.len().min(8)],
        true,
    )?;

    let mut b = Bench {
        model: &mut model,
        pool: &pool,
        n_batch,
        reps,
        profile: Vec::new(),
        decode_profiles: Vec::new(),
    };
    if cfg.rollback_ablation {
        return rollback_ablation(&mut b, cfg, &mut seq, &prompt);
    }
    if cfg.mtp_overhead {
        return mtp_overhead(&mut b, cfg, &mut seq, &prompt);
    }
    let depth_prefix: Vec<u32> = (0..cfg.depth).map(|_| next_id()).collect();
    let first_id = next_id();
    let empty = b.filled(&mut seq, &[])?;
    let at_depth = (cfg.depth > 0).then(|| b.filled(&mut seq, &depth_prefix)).transpose()?;
    let mut rates = Rates {
        pp: b.prefill(at_depth.is_none() && cfg.profile, &empty, &prompt)?,
        tg: b.decode(cfg.profile, &empty, first_id, cfg.gen_tokens)?,
        ..Rates::default()
    };
    let after_prompt = b.filled(&mut seq, &prompt)?;
    rates.tg_after_prompt = b.decode(false, &after_prompt, first_id, cfg.gen_tokens)?;
    if let Some(base) = &at_depth {
        rates.pp_depth = Some(b.prefill(cfg.profile, base, &prompt)?);
        rates.tg_depth = Some(b.decode(cfg.profile, base, first_id, cfg.gen_tokens)?);
    }
    tandem_options::write_stdout(|out| print_speed(out, cfg, &path, &rates, &b.profile, &b.decode_profiles, reps))?;
    Ok(())
}

/// Measured rates, tokens/s (means over the repetitions).
#[derive(Default)]
struct Rates {
    /// pp at depth 0.
    pp: f64,
    /// tg at depth 0.
    tg: f64,
    /// tg after the pp prompt (depth = --prompt-tokens).
    tg_after_prompt: f64,
    /// pp and tg at depth --depth (when > 0).
    pp_depth: Option<f64>,
    tg_depth: Option<f64>,
}

/// The model, pool and settings the pp / tg measurements share.
struct Bench<'a> {
    model: &'a mut Model,
    pool: &'a ThreadPool,
    n_batch: usize,
    reps: usize,
    /// The per-op table of the profiled prefill runs (`(op, seconds, share)`).
    profile: Vec<(&'static str, f64, f64)>,
    /// The per-op tables of the profiled decode runs, in order (depth 0, then --depth).
    decode_profiles: Vec<Vec<(&'static str, f64, f64)>>,
}

impl Bench<'_> {
    /// `seq` reset and filled with `prefix` (untimed); returns a copy to start runs from.
    fn filled(&mut self, seq: &mut SequenceState, prefix: &[u32]) -> anyhow::Result<SequenceState> {
        seq.reset();
        for chunk in prefix.chunks(self.n_batch) {
            self.model.forward(self.pool, seq, chunk, false)?;
        }
        Ok(seq.clone())
    }

    /// Mean tokens/s of prefilling `prompt` in micro-batches from a copy of `base` (the copy
    /// is made before the clock starts), with per-op timing when `profile`.
    fn prefill(&mut self, profile: bool, base: &SequenceState, prompt: &[u32]) -> anyhow::Result<f64> {
        if profile && !self.model.set_profiling(true) {
            eprintln!("bench: --profile: this architecture has no per-op timing; ignored");
        }
        let mut rates = Vec::with_capacity(self.reps);
        for _ in 0..self.reps {
            let mut seq = base.clone();
            let t = Instant::now();
            for chunk in prompt.chunks(self.n_batch) {
                self.model.forward(self.pool, &mut seq, chunk, false)?;
            }
            rates.push(prompt.len() as f64 / t.elapsed().as_secs_f64());
        }
        if profile {
            self.profile = self.model.profile().map(|p| p.table()).unwrap_or_default();
            self.model.set_profiling(false);
        }
        Ok(mean(&rates))
    }

    /// Mean tokens/s of decoding `n` tokens greedily, one per pass, from a copy of `base`.
    /// With `profile`, the passes are timed per op and the table (plus the token choice and
    /// the time between passes) is appended to `decode_profiles`.
    fn decode(&mut self, profile: bool, base: &SequenceState, first: u32, n: usize) -> anyhow::Result<f64> {
        let profile = profile && self.model.set_profiling(true);
        let mut rates = Vec::with_capacity(self.reps);
        let (mut wall, mut choice) = (Duration::ZERO, Duration::ZERO);
        for _ in 0..self.reps {
            let mut seq = base.clone();
            let mut id = first;
            let t = Instant::now();
            for _ in 0..n {
                let logits = self
                    .model
                    .forward(self.pool, &mut seq, &[id], true)?
                    .expect("logits");
                let c = Instant::now();
                id = crate::sampling::argmax(logits).unwrap_or(0);
                choice += c.elapsed();
            }
            wall += t.elapsed();
            rates.push(n as f64 / t.elapsed().as_secs_f64());
        }
        if profile {
            let mut ops = self.model.profile().cloned().unwrap_or_default();
            self.model.set_profiling(false);
            let in_ops: Duration = ops.total();
            ops.add("sampling (argmax)", choice);
            ops.add("between passes", wall.saturating_sub(in_ops + choice));
            self.decode_profiles.push(ops.table());
        }
        Ok(mean(&rates))
    }
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

/// One profile table as JSON rows (`op`, `ms_per_run`, `share`).
fn profile_json(profile: &[(&str, f64, f64)], reps: usize) -> serde_json::Value {
    profile
        .iter()
        .map(|(op, secs, share)| {
            serde_json::json!({ "op": op, "ms_per_run": secs * 1e3 / reps as f64, "share": share })
        })
        .collect()
}

/// Writes one profile table (markdown) under `title`.
fn print_profile(out: &mut impl Write, title: &str, profile: &[(&str, f64, f64)], reps: usize) -> std::io::Result<()> {
    writeln!(out, "\n{title}, mean of {reps} runs:")?;
    writeln!(out, "| op | ms per run | share |\n|---|---:|---:|")?;
    for (op, secs, share) in profile {
        writeln!(out, "| {op} | {:.2} | {:.1}% |", secs * 1e3 / reps as f64, share * 100.0)?;
    }
    Ok(())
}

/// Writes the pp / tg rates (tokens/s) at depth 0, after the prompt and at --depth, and
/// the prefill and decode profiles, as JSON or text.
fn print_speed(
    out: &mut impl Write,
    cfg: &BenchOptions,
    path: &std::path::Path,
    r: &Rates,
    profile: &[(&str, f64, f64)],
    decode_profiles: &[Vec<(&str, f64, f64)>],
    reps: usize,
) -> std::io::Result<()> {
    // With --depth, decode is profiled at depth 0 and at --depth: the last table is the
    // one at the profiled depth.
    let (decode_d0, decode) = match decode_profiles {
        [d0, dd] => (Some(d0), Some(dd)),
        [d] => (None, Some(d)),
        _ => (None, None),
    };
    if cfg.json {
        writeln!(
            out,
            "{}",
            serde_json::json!({
                "model": path.display().to_string(),
                "threads": cfg.n_threads(),
                "prompt_tokens": cfg.prompt_tokens,
                "gen_tokens": cfg.gen_tokens,
                "depth": cfg.depth,
                "kernels": dsp::backend::select().name(),
                "prefill_tokens_per_s": r.pp,
                "decode_tokens_per_s": r.tg,
                "decode_at_depth_tokens_per_s": r.tg_after_prompt,
                "prefill_at_d_tokens_per_s": r.pp_depth,
                "decode_at_d_tokens_per_s": r.tg_depth,
                "prefill_profile": profile_json(profile, reps),
                "decode_profile": decode.map(|d| profile_json(d, reps)),
                "decode_profile_depth0": decode_d0.map(|d| profile_json(d, reps)),
            })
        )?;
        return Ok(());
    }
    let (p, g, dd) = (cfg.prompt_tokens, cfg.gen_tokens, cfg.depth);
    writeln!(
        out,
        "model {}  threads {}  kernels {}",
        path.display(),
        cfg.n_threads(),
        dsp::backend::select().name()
    )?;
    writeln!(out, "pp{p:<5} {:>9.1} tokens/s", r.pp)?;
    writeln!(out, "tg{g:<5} {:>9.1} tokens/s", r.tg)?;
    writeln!(out, "tg{g:<5} {:>9.1} tokens/s after {p} prompt tokens", r.tg_after_prompt)?;
    if let (Some(pp), Some(tg)) = (r.pp_depth, r.tg_depth) {
        writeln!(out, "pp{p:<5} {pp:>9.1} tokens/s at depth {dd}")?;
        writeln!(out, "tg{g:<5} {tg:>9.1} tokens/s at depth {dd}")?;
    }
    let at = if dd > 0 { format!(" at depth {dd}") } else { String::new() };
    if !profile.is_empty() {
        print_profile(out, &format!("prefill profile (pp{p}{at})"), profile, reps)?;
    }
    if let Some(d0) = decode_d0 {
        print_profile(out, &format!("decode profile (tg{g} at depth 0)"), d0, reps)?;
    }
    if let Some(d) = decode {
        print_profile(out, &format!("decode profile (tg{g}{at})"), d, reps)?;
    }
    Ok(())
}

/// `--rollback-ablation`: plain vs rollback-aware vs per-token prefill of `prompt`.
fn rollback_ablation(b: &mut Bench, cfg: &BenchOptions, seq: &mut SequenceState, prompt: &[u32]) -> anyhow::Result<()> {
    let (model, pool, n_batch) = (&mut *b.model, b.pool, b.n_batch);
    use crate::state::rollback::RollbackPrefill;
    let rollback_k = cfg.rollback_states();
    if !model.is_recurrent() {
        anyhow::bail!(
            "--rollback-ablation needs a hybrid (recurrent) model; {} is {} (attention only: a rollback is a KV truncation)",
            cfg.model.as_ref().map_or("the default model".into(), |p| p.display().to_string()),
            model.architecture()
        );
    }
    let modes: [(&str, Option<RollbackPrefill>); 3] = [
        ("plain chunked", None),
        ("rollback-aware", Some(RollbackPrefill::Aware)),
        ("per-token with snapshots", Some(RollbackPrefill::PerToken)),
    ];
    let mut secs = [0f64; 3];
    let mut rb_ms = [0f64; 3];
    let reps = cfg.repetitions.max(1);
    for _ in 0..reps {
        for (i, (_, mode)) in modes.iter().enumerate() {
            match mode {
                Some(m) => model.set_rollback(rollback_k, *m),
                None => model.set_rollback(0, RollbackPrefill::Aware),
            }
            seq.reset();
            let t = Instant::now();
            for chunk in prompt.chunks(n_batch) {
                model.forward(pool, seq, chunk, false)?;
            }
            secs[i] += t.elapsed().as_secs_f64();
            rb_ms[i] += model.take_rollback_ms();
        }
    }
    let n = prompt.len() as f64 * reps as f64;
    tandem_options::write_stdout(|out| {
        if cfg.json {
            let rows: Vec<_> = modes
                .iter()
                .enumerate()
                .map(|(i, (name, _))| {
                    serde_json::json!({
                        "mode": name, "tokens_per_s": n / secs[i], "time_vs_plain": secs[i] / secs[0],
                        "rollback_ms_per_run": rb_ms[i] / reps as f64,
                    })
                })
                .collect();
            writeln!(
                out,
                "{}",
                serde_json::json!({"prompt_tokens": prompt.len(), "rollback_k": rollback_k, "threads": cfg.n_threads(), "modes": rows})
            )?;
        } else {
            writeln!(
                out,
                "prefill of {} tokens, K = {} rollback states, {} threads, mean of {reps} interleaved runs",
                prompt.len(),
                rollback_k,
                cfg.n_threads()
            )?;
            writeln!(out, "| mode | tokens/s | time vs plain | ms writing rollback states |\n|---|---:|---:|---:|")?;
            for (i, (name, _)) in modes.iter().enumerate() {
                writeln!(
                    out,
                    "| {name} | {:.1} | {:.3}x | {:.1} |",
                    n / secs[i],
                    secs[i] / secs[0],
                    rb_ms[i] / reps as f64
                )?;
            }
        }
        Ok(())
    })?;
    Ok(())
}

/// `--mtp-overhead`: what the MTP drafters cost (Tandem §3.3, §4.3): prefill with and
/// without filling the MTP KV cache, a verification pass vs a decode pass, and the time per
/// MTP draft token (full and trimmed heads).
fn mtp_overhead(b: &mut Bench, cfg: &BenchOptions, seq: &mut SequenceState, prompt: &[u32]) -> anyhow::Result<()> {
    let (model, pool, n_batch) = (&mut *b.model, b.pool, b.n_batch);
    use crate::speculative::mtp::{fill_with_model as mtp_fill, ModelMtp};
    use crate::model::MtpHead;
    use crate::state::rollback::RollbackPrefill;
    if !model.has_mtp() {
        anyhow::bail!(
            "--mtp-overhead needs a model with an MTP (nextn) block; {} has none",
            cfg.model
                .as_ref()
                .map_or("the default model".into(), |p| p.display().to_string())
        );
    }
    let k = pass_tokens(cfg.drafts());
    let reps = cfg.repetitions.max(1);
    let rounds = cfg.gen_tokens.max(1);
    model.set_rollback(k, RollbackPrefill::Aware);
    let mut cache = model
        .new_mtp_cache(seq.n_ctx())
        .ok_or_else(|| anyhow::anyhow!("no MTP cache for this model"))?;
    // (a) Prefill: rollback states on in both (the speculative setting), MTP fill in one.
    let prefill = |model: &mut Model,
                   fill: bool,
                   cache: &mut crate::state::mtp::MtpCache,
                   seq: &mut crate::state::sequence::SequenceState| {
        model.set_hidden_rows(fill);
        seq.reset();
        cache.reset();
        let t = Instant::now();
        for (i, chunk) in prompt.chunks(n_batch).enumerate() {
            model.forward(pool, seq, chunk, false)?;
            if fill {
                cache.push_hidden(i * n_batch, model.hidden_rows());
                mtp_fill(
                    model,
                    pool,
                    cache,
                    &prompt[..i * n_batch + chunk.len()],
                )?;
            }
        }
        anyhow::Ok(t.elapsed().as_secs_f64())
    };
    let (mut plain_s, mut fill_s) = (0.0, 0.0);
    for _ in 0..reps {
        plain_s += prefill(model, false, &mut cache, seq)?;
        fill_s += prefill(model, true, &mut cache, seq)?;
    }
    let n_tok = (prompt.len() * reps) as f64;
    // (b) From the filled prompt: decode passes of 1 token, then verification passes of k
    // tokens each rolled back (timed too), each kind in its steady state ([`steady_passes`]).
    let (mut decode_s, mut verify_s, mut rollback_s) = (0.0, 0.0, 0.0);
    let toks: Vec<u32> = prompt.iter().cycle().skip(7).take(k).copied().collect();
    steady_passes(model, pool, seq, &toks, rounds, &mut |_| {}, &mut |_, step, s| match step {
        SpecStep::Decode => decode_s += s,
        SpecStep::Verify => verify_s += s,
        SpecStep::Rollback => rollback_s += s,
    })?;
    // With --profile, the same alternation again from the prompt, with per-op timing, one
    // table per kind of pass (not in the timed figures above: the timing adds a clock read
    // per op).
    let mut pass_profiles = Vec::new();
    if cfg.profile {
        prefill(model, true, &mut cache, seq)?;
        pass_profiles = profile_passes(model, pool, seq, &toks, rounds)?;
    }
    // (c) Drafting n_draft tokens after the prompt, on a copy of the filled cache each time.
    prefill(model, true, &mut cache, seq)?;
    let mut heads = vec![("full vocabulary", MtpHead::Full, model.n_vocab())];
    if let Some(n) = model.mtp_draft_rows() {
        heads.push(("trimmed", MtpHead::Trimmed, n));
    }
    let mut draft_ms = Vec::new();
    for &(name, head, rows) in &heads {
        let mut secs = 0.0;
        let mut drafted = 0usize;
        for r in 0..rounds {
            let mut c = cache.clone();
            let mut step = ModelMtp {
                model: &mut *model,
                pool,
            };
            let newest = prompt[r % prompt.len()];
            let t = Instant::now();
            let d = crate::speculative::mtp::draft(&mut step, &mut c, prompt, newest, cfg.drafts(), head)?;
            secs += t.elapsed().as_secs_f64();
            drafted += d.map_or(0, |d| d.len());
        }
        draft_ms.push((name, rows, secs * 1e3 / drafted.max(1) as f64));
    }
    let m = MtpOverheadRun {
        prompt_tokens: prompt.len(),
        n_tok,
        plain_s,
        fill_s,
        decode_ms: decode_s * 1e3 / rounds as f64,
        verify_ms: verify_s * 1e3 / rounds as f64,
        rollback_ms: rollback_s * 1e3 / rounds as f64,
        draft_ms,
        pass_profiles,
    };
    tandem_options::write_stdout(|out| print_mtp_overhead(out, cfg, &m, reps, rounds))?;
    Ok(())
}

/// One timed step of [`steady_passes`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum SpecStep {
    Decode,
    Verify,
    Rollback,
}

/// The passes `--mtp-overhead` times, each kind in its steady state, interleaved so both
/// see the same machine: per round a plain decode pass of `toks[0]` on `seq` (after a decode
/// pass: nothing pending), then a verification pass of `toks` on a copy of `seq` made at the
/// start, rolled back to keep 0, 1, .., k − 2 of its drafts in turn (speculative decoding:
/// each verification follows the previous one's rollback, so it applies that rollback's
/// pending replay, `state/recurrent.rs`; one untimed verification first). `before(model)`
/// runs before each pass, `after(model, step, seconds)` after each pass and rollback.
fn steady_passes(
    model: &mut Model,
    pool: &ThreadPool,
    seq: &mut SequenceState,
    toks: &[u32],
    rounds: usize,
    before: &mut dyn FnMut(&mut Model),
    after: &mut dyn FnMut(&mut Model, SpecStep, f64),
) -> anyhow::Result<()> {
    let secs = |t: Instant| t.elapsed().as_secs_f64();
    let mut spec = seq.clone();
    let n_draft = toks.len() - 1;
    for r in 0..=rounds {
        if r > 0 {
            before(model);
            let t = Instant::now();
            model.forward(pool, seq, &toks[..1], true)?;
            after(model, SpecStep::Decode, secs(t));
        }
        let len = spec.len();
        before(model);
        let t = Instant::now();
        model.verify(pool, &mut spec, toks)?;
        let verify = secs(t);
        let t = Instant::now();
        model.rollback(&mut spec, len + 1 + r % n_draft)?;
        let rollback = secs(t);
        if r > 0 {
            after(model, SpecStep::Verify, verify);
            after(model, SpecStep::Rollback, rollback);
        }
    }
    Ok(())
}

/// [`steady_passes`] with per-op timing: the two tables, or none when the architecture has
/// no per-op timing.
fn profile_passes(
    model: &mut Model,
    pool: &ThreadPool,
    seq: &mut SequenceState,
    toks: &[u32],
    rounds: usize,
) -> anyhow::Result<Vec<(&'static str, Vec<(&'static str, f64, f64)>)>> {
    if !model.set_profiling(true) {
        eprintln!("bench: --profile: this architecture has no per-op timing; ignored");
        return Ok(Vec::new());
    }
    let (mut dec, mut ver) = (OpProfile::default(), OpProfile::default());
    steady_passes(
        model,
        pool,
        seq,
        toks,
        rounds,
        &mut |m| {
            m.set_profiling(true);
        },
        &mut |m, step, _| match step {
            SpecStep::Decode => dec.merge(m.profile().expect("profiling on")),
            SpecStep::Verify => ver.merge(m.profile().expect("profiling on")),
            SpecStep::Rollback => {}
        },
    )?;
    model.set_profiling(false);
    Ok(vec![("decode pass (1 token)", dec.table()), ("verification pass", ver.table())])
}

/// What `--mtp-overhead` measured.
struct MtpOverheadRun {
    prompt_tokens: usize,
    /// Prompt tokens over all prefill repetitions.
    n_tok: f64,
    /// Prefill seconds without and with the MTP KV fill.
    plain_s: f64,
    fill_s: f64,
    /// One decode pass, one verification pass of 1 + n_draft tokens and one rollback after
    /// it (mean over 0..n_draft drafts kept), ms.
    decode_ms: f64,
    verify_ms: f64,
    rollback_ms: f64,
    /// Per MTP head: (name, rows, ms per drafted token).
    draft_ms: Vec<(&'static str, usize, f64)>,
    /// With --profile: the per-op tables of the decode and the verification passes.
    pass_profiles: Vec<(&'static str, Vec<(&'static str, f64, f64)>)>,
}

/// Writes `--mtp-overhead`'s measurements as JSON or as a table.
fn print_mtp_overhead(out: &mut impl Write, cfg: &BenchOptions, m: &MtpOverheadRun, reps: usize, rounds: usize) -> std::io::Result<()> {
    let MtpOverheadRun { n_tok, plain_s, fill_s, decode_ms, verify_ms, rollback_ms, .. } = *m;
    let draft_ms = &m.draft_ms;
    if cfg.json {
        writeln!(
            out,
            "{}",
            serde_json::json!({
                "prompt_tokens": m.prompt_tokens, "threads": cfg.n_threads(), "n_draft": cfg.n_draft,
                "prefill_tokens_per_s": n_tok / plain_s,
                "prefill_mtp_fill_tokens_per_s": n_tok / fill_s,
                "decode_pass_ms": decode_ms, "verify_pass_ms": verify_ms, "rollback_ms": rollback_ms,
                "mtp_draft_ms_per_token": draft_ms.iter().map(|(name, rows, ms)| serde_json::json!({
                    "head": name, "rows": rows, "ms": ms,
                })).collect::<Vec<_>>(),
                "pass_profiles": m.pass_profiles.iter().map(|(name, table)| serde_json::json!({
                    "pass": name, "ops": profile_json(table, rounds),
                })).collect::<Vec<_>>(),
            })
        )?;
        return Ok(());
    }
    writeln!(
        out,
        "MTP overhead: prompt {} tokens, n_draft {}, {} threads, kernels {}, {reps} prefill runs, {rounds} rounds",
        m.prompt_tokens,
        cfg.n_draft,
        cfg.n_threads(),
        dsp::backend::select().name()
    )?;
    writeln!(out, "| measure | value | vs baseline |\n|---|---:|---:|")?;
    writeln!(
        out,
        "| prefill, rollback states, no MTP fill | {:.1} tokens/s | 1.000x |",
        n_tok / plain_s
    )?;
    writeln!(
        out,
        "| prefill, rollback states + MTP KV fill | {:.1} tokens/s | {:.3}x time |",
        n_tok / fill_s,
        fill_s / plain_s
    )?;
    writeln!(out, "| decode pass (1 token) | {decode_ms:.2} ms | 1.000x |")?;
    writeln!(
        out,
        "| verification pass (1 + {} tokens) | {verify_ms:.2} ms | {:.3}x |",
        cfg.n_draft,
        verify_ms / decode_ms
    )?;
    writeln!(
        out,
        "| rollback after it (0..{} drafts kept) | {rollback_ms:.2} ms | {:.3}x |",
        cfg.n_draft - 1,
        rollback_ms / decode_ms
    )?;
    for (name, rows, ms) in draft_ms {
        writeln!(
            out,
            "| MTP draft token, {name} ({rows} rows) | {ms:.2} ms | {:.3}x decode |",
            ms / decode_ms
        )?;
    }
    for (name, table) in &m.pass_profiles {
        print_profile(out, name, table, rounds)?;
    }
    Ok(())
}
