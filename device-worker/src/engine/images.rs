//! Images in chat prompts at admission (issue 19): each image part of a `ChatMessage` is
//! checked from its header (decoding limits, the request's pixel budget), decoded, resized
//! to the size the encoder takes it at ([`crate::model::vision::preprocess::smart_size`]:
//! `(H'/32)·(W'/32)` tokens) and its
//! decoded pixels freed before the next image is decoded, so a request holds one decoded
//! image at a time and its resized ones; each is laid out in the rendered chat
//! as `<|vision_start|>` + that many `<|image_pad|>` + `<|vision_end|>` at its place
//! ([`crate::prompt::IMAGE_MARKER`], [`crate::prompt::ImageLayout`]). A bad image is refused
//! here, on the handler's task, with INVALID_ARGUMENT naming `messages[i].parts[j]`.

use std::sync::Arc;

use gguf::chat_template::ChatMessage;
use gguf::tokenizer::Tokenizer;
use sha2::{Digest, Sha256};
use tandem_proto::step::v1 as pb;

use crate::error::WorkerError;
use crate::model::vision::decode::{decode, probe};
use crate::model::vision::preprocess::{check_shape, resize_for};
use crate::model::vision::{PreprocessOptions, RgbImage, VisionConfig, VisionError};
use crate::prompt::{chat_tokens_escaped, ChatTokens, ImageLayout, IMAGE_MARKER};
use gguf::chat_template::ChatTemplate;

/// The vision tokens a prompt with images needs in the model's vocabulary.
pub const VISION_TOKENS: [&str; 3] = ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>"];

/// What admission needs to lay images out: the projector's configuration (patch and merge
/// sizes), the preprocessing options (decoding limits, `--image-min-tokens` /
/// `--image-max-tokens`) and the id of `<|image_pad|>`.
#[derive(Clone, Debug)]
pub struct ImageAdmission {
    pub config: VisionConfig,
    pub options: PreprocessOptions,
    /// `<|image_pad|>` in the model's vocabulary.
    pub pad: u32,
}

impl ImageAdmission {
    /// For a worker started with `--mmproj` whose projector has `config`.
    ///
    /// Errors: [`WorkerError::LoadFailed`] naming the token when the model's vocabulary lacks
    /// one of [`VISION_TOKENS`] (the text model does not belong to this projector).
    pub fn new(
        tokenizer: &Tokenizer,
        config: VisionConfig,
        options: PreprocessOptions,
    ) -> Result<Self, WorkerError> {
        for t in VISION_TOKENS {
            if tokenizer.token_id(t).is_none() {
                return Err(WorkerError::LoadFailed(format!(
                    "--mmproj: the model's vocabulary has no {t} token, so it cannot take images"
                )));
            }
        }
        let pad = tokenizer.token_id(VISION_TOKENS[1]).unwrap_or_default();
        Ok(Self {
            config,
            options,
            pad,
        })
    }

    /// Checks `bytes` from the header (decoding limits, shape, and the request's pixel
    /// budget: `request_pixels` holds the pixels of the request's earlier images and grows by
    /// this one's), decodes them, and resizes the image to the size the encoder takes it at
    /// ([`resize_for`]); the decoded pixels are dropped on return.
    ///
    /// Errors: [`VisionError::RequestPixels`] over
    /// [`crate::model::vision::DecodeLimits::max_request_pixels`]; the [`VisionError`]s of
    /// [`probe`], [`decode`] and [`check_shape`] (all request faults).
    pub fn admit(
        &self,
        bytes: &[u8],
        request_pixels: &mut u64,
    ) -> Result<AdmittedImage, VisionError> {
        let limits = &self.options.limits;
        let probed = probe(bytes, limits)?;
        check_shape(probed.width as usize, probed.height as usize)?;
        let total = *request_pixels + probed.pixels();
        if total > limits.max_request_pixels {
            return Err(VisionError::RequestPixels {
                width: probed.width,
                height: probed.height,
                total,
                limit: limits.max_request_pixels,
            });
        }
        *request_pixels = total;
        let rgb = decode(bytes, limits)?;
        let source_size = (rgb.width, rgb.height);
        let resized = resize_for(rgb, &self.config, &self.options)?;
        let block = self.config.block_side();
        let grid = (resized.height / block, resized.width / block);
        Ok(AdmittedImage {
            n_tokens: grid.0 * grid.1,
            grid,
            hash: Sha256::digest(bytes).into(),
            source_size,
            resized: Arc::new(resized),
        })
    }
}

/// One image of an admitted prompt.
#[derive(Clone, Debug)]
pub struct AdmittedImage {
    /// Image tokens (merged patches), `grid.0 · grid.1`.
    pub n_tokens: usize,
    /// Rows and columns of image tokens (merged 2×2 patch blocks) after resizing.
    pub grid: (usize, usize),
    /// SHA-256 of the image's bytes: its identity for the prefix match and the embedding
    /// cache.
    pub hash: [u8; 32],
    /// The decoded image's `(width, height)`, pixels.
    pub source_size: (usize, usize),
    /// The image resized for the encoder (sides `grid · 32`; patched and encoded by the
    /// engine unless its embeddings are cached).
    pub resized: Arc<RgbImage>,
}

/// An image placed in a prompt.
#[derive(Clone, Debug)]
pub struct PromptImage {
    /// Index of its first image token in the prompt.
    pub start: usize,
    pub image: AdmittedImage,
}

/// The high bit of the ids that stand for image tokens in an admitted prompt (no vocabulary
/// has 2³¹ tokens, and admission refuses token prompts with ids outside the vocabulary).
pub const IMAGE_ID_BIT: u32 = 1 << 31;

/// The ids standing for an image's `n` tokens in an admitted prompt, from its content hash:
/// token `k` is [`IMAGE_ID_BIT`] with 31 bits of hash word `k mod 8` xor `k`. The slot
/// prefix match, the prompt cache and the planner compare token ids, so two prompts share an
/// image's tokens only when the image is the same (up to a collision of all eight 31-bit
/// words, 2⁻²⁴⁸), as llama.cpp compares image chunks by id. The model never embeds these ids:
/// it takes the image's embeddings there ([`crate::model::multimodal`]).
pub fn image_token_ids(hash: &[u8; 32], n: usize) -> impl Iterator<Item = u32> + '_ {
    (0..n).map(move |k| {
        let w = k % 8;
        let word = u32::from_le_bytes([
            hash[4 * w],
            hash[4 * w + 1],
            hash[4 * w + 2],
            hash[4 * w + 3],
        ]);
        IMAGE_ID_BIT | ((word ^ k as u32) & !IMAGE_ID_BIT)
    })
}

/// Replaces the `<|image_pad|>` tokens of each image in `prompt` with its
/// [`image_token_ids`].
pub fn mark_image_tokens(prompt: &mut [u32], images: &[PromptImage]) {
    for im in images {
        let span = &mut prompt[im.start..im.start + im.image.n_tokens];
        for (t, id) in span
            .iter_mut()
            .zip(image_token_ids(&im.image.hash, im.image.n_tokens))
        {
            *t = id;
        }
    }
}

/// Whether any message of `messages` has content parts (text or image).
pub fn has_parts(messages: &[pb::ChatMessage]) -> bool {
    messages.iter().any(|m| !m.parts.is_empty())
}

/// Text bytes of a message: its content and its text parts.
pub fn text_bytes(m: &pb::ChatMessage) -> usize {
    m.content.len()
        + m.parts
            .iter()
            .map(|p| match &p.part {
                Some(pb::content_part::Part::Text(t)) => t.len(),
                _ => 0,
            })
            .sum::<usize>()
}

/// Renders and tokenizes chat messages with content parts: text is escaped as every
/// message content is ([`Tokenizer::escape_special`]), each image is admitted
/// ([`ImageAdmission::admit`]) and written as [`IMAGE_MARKER`], then the pads are expanded
/// to each image's token count. Returns the tokens and the images with their places.
///
/// Errors: [`WorkerError::InvalidRequest`] naming `messages[i].parts[j]` for an image the
/// worker cannot take (no `--mmproj`: [`VisionError::NoProjector`]; the decode and shape
/// errors of [`ImageAdmission::admit`]) or an empty part; those of [`chat_tokens_escaped`].
pub fn chat_tokens_with_parts(
    tokenizer: &Tokenizer,
    template: &ChatTemplate,
    vision: Option<&ImageAdmission>,
    messages: Vec<pb::ChatMessage>,
    max_tokens: usize,
) -> Result<(ChatTokens, Vec<PromptImage>), WorkerError> {
    let mut images = Vec::new();
    let mut request_pixels = 0u64;
    let mut msgs = Vec::with_capacity(messages.len());
    for (i, m) in messages.into_iter().enumerate() {
        let mut content = tokenizer.escape_special(&m.content).into_owned();
        for (j, p) in m.parts.into_iter().enumerate() {
            let at = |e: &dyn std::fmt::Display| {
                WorkerError::InvalidRequest(format!("messages[{i}].parts[{j}]: {e}"))
            };
            match p.part {
                Some(pb::content_part::Part::Text(t)) => {
                    content.push_str(&tokenizer.escape_special(&t))
                }
                Some(pb::content_part::Part::Image(bytes)) => {
                    let v = vision.ok_or_else(|| at(&VisionError::NoProjector))?;
                    images.push(v.admit(&bytes, &mut request_pixels).map_err(|e| at(&e))?);
                    content.push_str(IMAGE_MARKER);
                }
                None => return Err(at(&"a content part with neither text nor image")),
            }
        }
        msgs.push(ChatMessage {
            role: m.role,
            content,
        });
    }
    let n_tokens: Vec<usize> = images.iter().map(|im| im.n_tokens).collect();
    let layout = vision.map(|v| ImageLayout {
        pad: v.pad,
        n_tokens: &n_tokens,
    });
    let ct = chat_tokens_escaped(
        tokenizer,
        template,
        &msgs,
        max_tokens,
        layout.filter(|_| !images.is_empty()),
    )?;
    let placed = ct
        .image_starts
        .iter()
        .zip(images)
        .map(|(&start, image)| PromptImage { start, image })
        .collect();
    Ok((ct, placed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_ids_are_outside_the_vocabulary_and_differ_between_images() {
        let (a, mut b) = ([7u8; 32], [7u8; 32]);
        b[31] ^= 1; // differs only in the last hash word
        let ia: Vec<u32> = image_token_ids(&a, 20).collect();
        let ib: Vec<u32> = image_token_ids(&b, 20).collect();
        assert!(ia.iter().all(|&t| t & IMAGE_ID_BIT != 0));
        // Tokens within one image differ (no run of equal ids the prompt lookup could match).
        assert_ne!(ia[0], ia[1]);
        // The first seven tokens use the shared words; the eighth tells the images apart.
        assert_eq!(ia[..7], ib[..7]);
        assert_ne!(ia[7], ib[7]);
        assert_eq!(ia, image_token_ids(&a, 20).collect::<Vec<_>>());
    }

    #[test]
    fn expanded_pads_take_each_image_count_in_order() {
        let (out, starts, found) = crate::prompt::expand_image_pads(&[1, 9, 2, 9, 3], 9, &[3, 2]);
        assert_eq!(out, vec![1, 9, 9, 9, 2, 9, 9, 3]);
        assert_eq!(starts, vec![1, 5]);
        assert_eq!(found, 2);
        // More pads than images: the rest stay single and are counted.
        let (out, starts, found) = crate::prompt::expand_image_pads(&[9, 9], 9, &[2]);
        assert_eq!((out, starts, found), (vec![9, 9, 9], vec![0], 2));
    }
}
