//! The dry-run planner over every corpus episode (prompts built and tokenized as the gateway
//! and worker do): with the gateway's prompt format (rules as a system message) the divergence
//! policy with batch consolidation processes at most 1.05× the new prompt tokens a KV cache
//! would; in both formats it processes no more than the stock policy, in fewer passes. Needs
//! the default model (the tokenizer; `TANDEM_MODEL`) and the corpus, required inputs; the
//! planned state sizes are those of the Qwen3.5-0.8B hybrid (the committed metadata-only
//! `qwen35-0.8b-shapes.gguf`).

use model_tools::dry_run::{run, DryRunArgs, PromptFormat};

#[test]
fn divergence_with_consolidation_stays_within_5_percent_of_the_kv_bound() {
    let corpus = test_support::corpus_dir();
    let args = DryRunArgs {
        model: Some(test_support::model_path()),
        state_shapes: Some(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../device-worker/tests/fixtures/qwen35/qwen35-0.8b-shapes.gguf"),
        ),
        format: PromptFormat::Both,
        micro_batch: 512,
        checkpoints: 8,
        checkpoint_min_gap: 32,
        per_step: std::env::var_os("DRY_RUN_PER_STEP").is_some(),
    };
    let summaries = run(&corpus, &[], &args).expect("dry run");
    assert_eq!(summaries.len(), 2);
    for s in &summaries {
        assert!(s.steps >= 20, "{}: only {} steps", s.format, s.steps);
        let div = s.configs.iter().find(|c| c.0 == "div+cons").expect("div+cons");
        if s.format == "SystemUser" {
            assert!(
                div.1 <= 1.05 * s.mean_kv_bound_new,
                "{}: divergence+consolidation {:.1} new tokens/step vs KV bound {:.1}",
                s.format,
                div.1,
                s.mean_kv_bound_new
            );
        }
        let stock = s.configs.iter().find(|c| c.0 == "stock").expect("stock");
        assert!(div.1 <= stock.1, "{}: {:.1} vs stock {:.1}", s.format, div.1, stock.1);
        assert!(div.2 < stock.2, "{}: passes {:.2} vs stock {:.2}", s.format, div.2, stock.2);
        // Consolidation never adds passes.
        let plain = s.configs.iter().find(|c| c.0 == "divergence").expect("divergence");
        assert!(div.2 <= plain.2, "{}: passes {} vs {}", s.format, div.2, plain.2);
    }
}
