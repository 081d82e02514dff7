//! The projector file (`--mmproj`): the vision tower + merger that llama.cpp's converter
//! writes for Qwen3.5 (`convert_hf_to_gguf.py --mmproj`, class `Qwen3VLVisionModel` in
//! `conversion/qwen3vl.py`), read into a typed [`VisionConfig`] and bound tensors
//! ([`Projector`]) with every shape checked. Graph and names follow llama.cpp
//! `tools/mtmd/models/qwen3vl.cpp` and `tools/mtmd/clip.cpp` (projector `qwen3vl_merger`).

use std::path::Path;
use std::sync::Arc;

use gguf::GgufFile;

use super::VisionError;
use crate::model::loader::Loader;
use crate::model::weights::Linear;

/// Projector types this build runs (`clip.projector_type`).
pub const PROJECTOR_TYPES: &[&str] = &["qwen3vl_merger"];
/// Frames per patch in time: a still image is two identical frames (the converter writes
/// the two temporal slices of the 3-D patch kernel as `v.patch_embd.weight` and `.weight.1`).
pub const TEMPORAL_PATCH: usize = 2;

/// The `clip.vision.*` hyperparameters of a `qwen3vl_merger` projector.
#[derive(Clone, Debug, PartialEq)]
pub struct VisionConfig {
    /// `clip.vision.image_size`: side of the learned position grid in pixels
    /// (`n_position_side · patch_size`).
    pub image_size: usize,
    /// `clip.vision.patch_size` (16 for Qwen3.5).
    pub patch_size: usize,
    /// `clip.vision.embedding_length`: the tower's hidden size.
    pub n_embd: usize,
    /// `clip.vision.feed_forward_length`.
    pub n_ff: usize,
    /// `clip.vision.block_count`.
    pub n_layer: usize,
    /// `clip.vision.attention.head_count`.
    pub n_head: usize,
    /// `clip.vision.projection_dim`: the merger's output size (= the text hidden size).
    pub projection_dim: usize,
    /// `clip.vision.spatial_merge_size` (2: 2×2 patches become one token).
    pub spatial_merge: usize,
    /// `clip.vision.attention.layer_norm_epsilon`.
    pub layer_norm_eps: f32,
    /// `clip.vision.image_mean`, per RGB channel, on the 0..1 scale.
    pub image_mean: [f32; 3],
    /// `clip.vision.image_std`, per RGB channel.
    pub image_std: [f32; 3],
}

impl VisionConfig {
    /// Head dim (`n_embd / n_head`).
    pub fn head_dim(&self) -> usize {
        self.n_embd / self.n_head
    }

    /// Side of the learned position grid in patches (`image_size / patch_size`).
    pub fn n_position_side(&self) -> usize {
        self.image_size / self.patch_size
    }

    /// Values in one flattened patch: `3 · TEMPORAL_PATCH · patch²` (HF's pixel_values row).
    pub fn patch_values(&self) -> usize {
        3 * TEMPORAL_PATCH * self.patch_size * self.patch_size
    }

    /// Side of one output token's pixel block (`patch_size · spatial_merge`, 32).
    pub fn block_side(&self) -> usize {
        self.patch_size * self.spatial_merge
    }

    /// Reads and checks the hyperparameters of `file`.
    ///
    /// Errors: [`VisionError::NotProjector`], [`VisionError::UnknownProjector`],
    /// [`VisionError::NoVisionEncoder`], [`VisionError::Gguf`] for a missing key,
    /// [`VisionError::Hyperparameter`] for values the encoder cannot run.
    pub fn from_gguf(file: &GgufFile) -> Result<Self, VisionError> {
        let arch = file.architecture()?;
        if arch != "clip" {
            return Err(VisionError::NotProjector {
                found: arch.to_string(),
            });
        }
        let proj = file.get_str("clip.projector_type")?;
        if !PROJECTOR_TYPES.contains(&proj) {
            return Err(VisionError::UnknownProjector {
                found: proj.to_string(),
                supported: PROJECTOR_TYPES.join(", "),
            });
        }
        if !file
            .get_bool_opt("clip.has_vision_encoder")
            .unwrap_or(false)
        {
            return Err(VisionError::NoVisionEncoder);
        }
        let u = |key: &str| file.get_u32(key).map(|v| v as usize);
        let cfg = Self {
            image_size: u("clip.vision.image_size")?,
            patch_size: u("clip.vision.patch_size")?,
            n_embd: u("clip.vision.embedding_length")?,
            n_ff: u("clip.vision.feed_forward_length")?,
            n_layer: u("clip.vision.block_count")?,
            n_head: u("clip.vision.attention.head_count")?,
            projection_dim: u("clip.vision.projection_dim")?,
            spatial_merge: file
                .get_u32_opt("clip.vision.spatial_merge_size")
                .unwrap_or(2) as usize,
            layer_norm_eps: file.get_f32("clip.vision.attention.layer_norm_epsilon")?,
            image_mean: rgb(file, "clip.vision.image_mean")?,
            image_std: rgb(file, "clip.vision.image_std")?,
        };
        cfg.check()?;
        Ok(cfg)
    }

    /// The constraints of llama.cpp's `qwen3vl` graph (merge 2 is hard-coded there, the 2-D
    /// rotary splits the head dim in quarters, the position grid is square).
    fn check(&self) -> Result<(), VisionError> {
        let bad = |key: &'static str, value: usize, why: &'static str| {
            Err(VisionError::Hyperparameter {
                key,
                value: value.to_string(),
                why,
            })
        };
        if self.patch_size == 0 || self.image_size % self.patch_size != 0 {
            return bad(
                "clip.vision.patch_size",
                self.patch_size,
                "must divide image_size",
            );
        }
        if self.spatial_merge != 2 {
            return bad(
                "clip.vision.spatial_merge_size",
                self.spatial_merge,
                "must be 2",
            );
        }
        if self.n_position_side() % self.spatial_merge != 0 {
            return bad(
                "clip.vision.image_size",
                self.image_size,
                "position grid must split into 2x2 blocks",
            );
        }
        if self.n_head == 0 || self.n_embd % self.n_head != 0 || self.head_dim() % 4 != 0 {
            return bad(
                "clip.vision.attention.head_count",
                self.n_head,
                "head dim must be a multiple of 4",
            );
        }
        for (key, v) in [
            ("clip.vision.block_count", self.n_layer),
            ("clip.vision.feed_forward_length", self.n_ff),
            ("clip.vision.projection_dim", self.projection_dim),
        ] {
            if v == 0 {
                return bad(key, v, "must be positive");
            }
        }
        if self.image_std.iter().any(|s| !(s.is_finite() && *s > 0.0)) {
            return Err(VisionError::Hyperparameter {
                key: "clip.vision.image_std",
                value: format!("{:?}", self.image_std),
                why: "must be finite and positive",
            });
        }
        Ok(())
    }
}

/// A 3-value per-channel array key.
fn rgb(file: &GgufFile, key: &'static str) -> Result<[f32; 3], VisionError> {
    let v = file.get_f32_array(key)?;
    <[f32; 3]>::try_from(v.as_slice()).map_err(|_| VisionError::Hyperparameter {
        key,
        value: format!("{v:?}"),
        why: "must hold 3 values (R, G, B)",
    })
}

/// A LayerNorm's weight and bias (`{name}.weight`, `{name}.bias`).
#[derive(Clone, Debug)]
pub struct Norm {
    pub weight: Vec<f32>,
    pub bias: Vec<f32>,
}

/// A product with bias: `y = W x + b`, `W` `[rows, cols]`.
#[derive(Clone, Debug)]
pub struct Affine {
    pub weight: Linear,
    pub bias: Vec<f32>,
}

/// One pre-LN vision block (`v.blk.N.*`).
#[derive(Clone, Debug)]
pub struct VisionBlock {
    /// `ln1`: before attention.
    pub ln1: Norm,
    /// `attn_qkv`: `[3·n_embd, n_embd]`, rows q | k | v.
    pub qkv: Affine,
    /// `attn_out`: `[n_embd, n_embd]`.
    pub out: Affine,
    /// `ln2`: before the MLP.
    pub ln2: Norm,
    /// `ffn_up`: `[n_ff, n_embd]`.
    pub up: Affine,
    /// `ffn_down`: `[n_embd, n_ff]`.
    pub down: Affine,
}

/// A loaded `qwen3vl_merger` projector: its file (weights are read from the mapping), the
/// configuration and the bound tensors.
pub struct Projector {
    pub file: Arc<GgufFile>,
    pub config: VisionConfig,
    /// `v.patch_embd.weight` and `.weight.1` (the two temporal slices), each
    /// `[n_embd, 3·patch·patch]` row-major (GGUF dims `[patch, patch, 3, n_embd]`), f32.
    pub patch_embd: [Vec<f32>; TEMPORAL_PATCH],
    /// `v.patch_embd.bias` `[n_embd]`.
    pub patch_bias: Vec<f32>,
    /// `v.position_embd.weight`: `[n_position_side², n_embd]` row-major, f32.
    pub position_embd: Vec<f32>,
    pub blocks: Vec<VisionBlock>,
    /// `v.post_ln`: the merger's LayerNorm, per patch (`n_embd`).
    pub merger_norm: Norm,
    /// `mm.0`: `[4·n_embd, 4·n_embd]` over 2×2 concatenated patches.
    pub merger_fc1: Affine,
    /// `mm.2`: `[projection_dim, 4·n_embd]`.
    pub merger_fc2: Affine,
}

impl std::fmt::Debug for Projector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Projector")
            .field("config", &self.config)
            .field("blocks", &self.blocks.len())
            .finish_non_exhaustive()
    }
}

impl Projector {
    /// Opens the mmproj GGUF at `path` and binds it for a text model of hidden size
    /// `text_hidden`.
    ///
    /// Errors: [`VisionError::Open`] (unreadable file, naming it), everything of
    /// [`VisionConfig::from_gguf`] and [`Projector::bind`].
    pub fn open(path: &Path, text_hidden: usize) -> Result<Self, VisionError> {
        let file = GgufFile::open(path).map_err(|error| VisionError::Open {
            path: path.to_path_buf(),
            error,
        })?;
        Self::bind(Arc::new(file), text_hidden)
    }

    /// Binds the tensors of `file` (see [`Projector::open`]).
    ///
    /// Errors: [`VisionError::ProjectionMismatch`] when `clip.vision.projection_dim` is not
    /// `text_hidden`; [`VisionError::Tensor`] for a missing tensor or one of another shape.
    pub fn bind(file: Arc<GgufFile>, text_hidden: usize) -> Result<Self, VisionError> {
        let config = VisionConfig::from_gguf(&file)?;
        if config.projection_dim != text_hidden {
            return Err(VisionError::ProjectionMismatch {
                projection_dim: config.projection_dim,
                text_hidden,
            });
        }
        let ld = Loader::new(&file);
        let (e, p) = (config.n_embd as u64, config.patch_size as u64);
        let kernel = [p, p, 3, e];
        let patch_embd = [
            ld.shaped("v.patch_embd.weight", &kernel)?,
            ld.shaped("v.patch_embd.weight.1", &kernel)?,
        ];
        let n_pos = (config.n_position_side() * config.n_position_side()) as u64;
        let merged = 4 * config.n_embd;
        let projector = Self {
            patch_bias: ld.vector("v.patch_embd.bias", config.n_embd)?,
            position_embd: ld.shaped("v.position_embd.weight", &[e, n_pos])?,
            blocks: (0..config.n_layer)
                .map(|i| bind_block(&ld, &config, i))
                .collect::<Result<_, _>>()?,
            merger_norm: norm(&ld, "v.post_ln", config.n_embd)?,
            merger_fc1: affine(&ld, "mm.0", merged, merged)?,
            merger_fc2: affine(&ld, "mm.2", config.projection_dim, merged)?,
            patch_embd,
            config,
            file: Arc::clone(&file),
        };
        Ok(projector)
    }

    /// Parameters bound (every tensor above).
    pub fn n_params(&self) -> u64 {
        self.file.tensors().map(|t| t.n_elements()).sum()
    }
}

/// The projector a request with images needs: `projector`, or the typed refusal the engine
/// maps to INVALID_ARGUMENT when the worker runs a text-only model.
///
/// Errors: [`VisionError::NoProjector`].
pub fn require(projector: Option<&Projector>) -> Result<&Projector, VisionError> {
    projector.ok_or(VisionError::NoProjector)
}

fn norm(ld: &Loader<'_>, name: &str, len: usize) -> Result<Norm, VisionError> {
    Ok(Norm {
        weight: ld.vector(&format!("{name}.weight"), len)?,
        bias: ld.vector(&format!("{name}.bias"), len)?,
    })
}

fn affine(ld: &Loader<'_>, name: &str, rows: usize, cols: usize) -> Result<Affine, VisionError> {
    Ok(Affine {
        weight: ld.linear(&format!("{name}.weight"), rows, cols)?,
        bias: ld.vector(&format!("{name}.bias"), rows)?,
    })
}

fn bind_block(ld: &Loader<'_>, c: &VisionConfig, i: usize) -> Result<VisionBlock, VisionError> {
    let pre = format!("v.blk.{i}");
    Ok(VisionBlock {
        ln1: norm(ld, &format!("{pre}.ln1"), c.n_embd)?,
        qkv: affine(ld, &format!("{pre}.attn_qkv"), 3 * c.n_embd, c.n_embd)?,
        out: affine(ld, &format!("{pre}.attn_out"), c.n_embd, c.n_embd)?,
        ln2: norm(ld, &format!("{pre}.ln2"), c.n_embd)?,
        up: affine(ld, &format!("{pre}.ffn_up"), c.n_ff, c.n_embd)?,
        down: affine(ld, &format!("{pre}.ffn_down"), c.n_embd, c.n_ff)?,
    })
}
