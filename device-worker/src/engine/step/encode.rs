//! Stage 1b, encode (issue 19): after the restore, so only the images past the resume point
//! are looked at (Tandem §4.5: the shared text prefix is restored first, then the new
//! screenshot is encoded). Each such image's embeddings come from the image cache
//! (by content hash) or from the projector; the model then gets the sequence's images
//! (embeddings for the spans it computes, positions for all) until the request ends.

use std::sync::Arc;
use std::time::Instant;

use super::super::compute::Compute;
use super::super::request::EngineRequest;
use super::ms;
use crate::error::WorkerError;
use crate::model::multimodal::{ImageSpan, SequenceImages};
use crate::model::vision::preprocess::preprocess_resized;
use crate::model::vision::EncodeOptions;

/// What the stage did, for [`tandem_proto::step::v1::PrefillStats`].
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Encoded {
    /// Image tokens in the prompt.
    pub image_tokens: u32,
    /// Images encoded now, and images found in the cache (both past `resume`).
    pub encoded: u32,
    pub cache_hits: u32,
    /// Time patching and encoding the images encoded now (0 when every image was reused or
    /// found in the cache).
    pub encoder_ms: f64,
}

/// Readies the images of `req` for passes that resume at `resume` and hands them to the
/// model ([`crate::model::CausalLm::set_images`]; `None` for a text prompt).
///
/// Errors: [`WorkerError::Vision`] from preprocessing or the encoder;
/// [`WorkerError::Internal`] for images on a worker without a projector (admission refuses
/// them) or embeddings of another token count than admission laid out.
pub(super) fn run(
    c: &mut Compute,
    req: &EngineRequest,
    resume: usize,
) -> Result<Encoded, WorkerError> {
    let mut out = Encoded::default();
    if req.images.is_empty() {
        c.model.set_images(None)?;
        return Ok(out);
    }
    let projector = c.projector.clone().ok_or_else(|| {
        WorkerError::Internal("an image reached a worker without a projector".into())
    })?;
    let mut spans = Vec::with_capacity(req.images.len());
    for im in &req.images {
        let n = im.image.n_tokens;
        out.image_tokens += n as u32;
        let embd = if im.start + n <= resume {
            None
        } else if let Some(e) = c.image_cache.get(&im.image.hash) {
            out.cache_hits += 1;
            Some(e)
        } else {
            let t0 = Instant::now();
            let pre = preprocess_resized(&im.image.resized, im.image.source_size, &projector.config);
            if pre.n_tokens != n {
                return Err(WorkerError::Internal(format!(
                    "image at {}: admission laid out {n} tokens, preprocessing made {}",
                    im.start, pre.n_tokens
                )));
            }
            let e = Arc::new(projector.encode(&c.pool, &pre, &EncodeOptions::default())?);
            out.encoder_ms += ms(t0.elapsed());
            c.image_cache.insert(im.image.hash, e.clone());
            c.images_encoded += 1;
            out.encoded += 1;
            Some(e)
        };
        spans.push(ImageSpan {
            start: im.start,
            grid: im.image.grid,
            embd,
        });
    }
    let images = SequenceImages::new(spans, c.model.n_embd())?;
    c.model.set_images(Some(Arc::new(images)))?;
    Ok(out)
}
