//! Pillow-compatible bicubic resampling of RGB8 images, in fixed point so that results are
//! bit-identical to Pillow's `Image.resize(size, Image.BICUBIC)` and to llama.cpp's
//! `resize_pillow` (`tools/mtmd/mtmd-image.cpp`), which follows Pillow's
//! `src/libImaging/Resample.c`: a separable filter (horizontal pass, then vertical), cubic
//! kernel with a = −0.5 widened by the scale when shrinking, weights normalised per output
//! pixel and rounded to 22 fractional bits (±0.5 then truncation), accumulators starting at
//! one half, results shifted back and clamped to 0..=255. Checked against Pillow
//! (`tests/vision.rs`, `pillow_resize.json`) and, through the whole preprocessing, against
//! llama.cpp's own f32 pixels (`tests/vision_parity.rs`, `llama_cpp/pixels.json`).
//!
//! [`fit`] puts an image into a target size either stretched (Hugging Face's processor) or
//! llama.cpp's way for Qwen-VL (`img_tool::resize` with `PAD_CEIL`: aspect-preserving
//! resize, black padding centred).

use super::decode::RgbImage;

/// Fractional bits of the fixed-point weights: 32 − 8 (pixel) − 2 (headroom).
const PRECISION_BITS: u32 = 32 - 8 - 2;
/// Support radius of the cubic kernel, input pixels at scale 1.
const SUPPORT: f64 = 2.0;

/// How an image is put into the target size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fit {
    /// llama.cpp's `PAD_CEIL` (its default for `qwen3vl_merger`): scale = min(tw/w, th/h)
    /// in f32, content = min(⌈w·scale⌉, tw) × min(⌈h·scale⌉, th) resized bicubically and
    /// placed on black at ((tw − cw)/2, (th − ch)/2), integer division.
    PadCeil,
    /// Hugging Face's processor: a plain bicubic resize to the target (aspect not kept).
    Stretch,
}

/// The cubic convolution kernel with a = −0.5 (Keys; Pillow's `bicubic_filter`).
fn cubic(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        (((x - 5.0) * x + 8.0) * x - 4.0) * A
    } else {
        0.0
    }
}

/// Per output pixel of one axis: the first input index, the number of inputs and their
/// fixed-point weights (`ksize` slots per output).
struct Coefficients {
    first: Vec<usize>,
    count: Vec<usize>,
    ksize: usize,
    weights: Vec<i32>,
}

/// The filter coefficients for resampling an axis of `in_size` pixels to `out_size`
/// (Pillow `precompute_coeffs` + `normalize_coeffs_8bpc`, re-derived, not copied).
fn coefficients(in_size: usize, out_size: usize) -> Coefficients {
    let scale = in_size as f64 / out_size as f64;
    let filterscale = scale.max(1.0);
    let support = SUPPORT * filterscale;
    let ksize = support.ceil() as usize * 2 + 1;
    let mut c = Coefficients {
        first: Vec::with_capacity(out_size),
        count: Vec::with_capacity(out_size),
        ksize,
        weights: vec![0; out_size * ksize],
    };
    let one = f64::from(1u32 << PRECISION_BITS);
    let ss = 1.0 / filterscale;
    let mut w = vec![0f64; ksize];
    for xx in 0..out_size {
        let center = (xx as f64 + 0.5) * scale;
        // Truncation toward zero as C's (int) cast; both bounds are >= -0.5 + 0.5 here.
        let lo = ((center - support + 0.5) as i64).max(0) as usize;
        let hi = ((center + support + 0.5) as i64).min(in_size as i64) as usize;
        let n = hi - lo;
        let mut total = 0.0;
        for (x, wx) in w.iter_mut().enumerate().take(n) {
            *wx = cubic((x as f64 + lo as f64 - center + 0.5) * ss);
            total += *wx;
        }
        for x in 0..n {
            let v = if total != 0.0 { w[x] / total } else { w[x] };
            let r = if v < 0.0 {
                v * one - 0.5
            } else {
                v * one + 0.5
            };
            c.weights[xx * ksize + x] = r as i32;
        }
        c.first.push(lo);
        c.count.push(n);
    }
    c
}

/// `acc >> PRECISION_BITS` clamped to a byte.
fn clip8(acc: i32) -> u8 {
    (acc >> PRECISION_BITS).clamp(0, 255) as u8
}

/// Resamples the rows of `src` to `out_w` columns.
fn horizontal(src: &RgbImage, out_w: usize, c: &Coefficients) -> RgbImage {
    let mut out = vec![0u8; out_w * src.height * 3];
    let half = 1i32 << (PRECISION_BITS - 1);
    for y in 0..src.height {
        let row = &src.data[y * src.width * 3..(y + 1) * src.width * 3];
        for xx in 0..out_w {
            let k = &c.weights[xx * c.ksize..xx * c.ksize + c.count[xx]];
            let mut acc = [half; 3];
            for (i, &wk) in k.iter().enumerate() {
                let p = &row[(c.first[xx] + i) * 3..(c.first[xx] + i) * 3 + 3];
                for ch in 0..3 {
                    acc[ch] += i32::from(p[ch]) * wk;
                }
            }
            let o = (y * out_w + xx) * 3;
            for ch in 0..3 {
                out[o + ch] = clip8(acc[ch]);
            }
        }
    }
    RgbImage {
        width: out_w,
        height: src.height,
        data: out,
    }
}

/// Resamples the columns of `src` to `out_h` rows.
fn vertical(src: &RgbImage, out_h: usize, c: &Coefficients) -> RgbImage {
    let row_len = src.width * 3;
    let mut out = vec![0u8; row_len * out_h];
    let mut acc = vec![0i32; row_len];
    for yy in 0..out_h {
        acc.fill(1 << (PRECISION_BITS - 1));
        let k = &c.weights[yy * c.ksize..yy * c.ksize + c.count[yy]];
        for (i, &wk) in k.iter().enumerate() {
            let y = c.first[yy] + i;
            for (a, &p) in acc
                .iter_mut()
                .zip(&src.data[y * row_len..(y + 1) * row_len])
            {
                *a += i32::from(p) * wk;
            }
        }
        for (o, &a) in out[yy * row_len..(yy + 1) * row_len].iter_mut().zip(&acc) {
            *o = clip8(a);
        }
    }
    RgbImage {
        width: src.width,
        height: out_h,
        data: out,
    }
}

/// `src` resized to `width × height` with Pillow's bicubic filter; an axis of unchanged
/// size is not filtered (as in Pillow and llama.cpp), so equal sizes give a copy.
///
/// Panics if a size is 0.
pub fn resize_bicubic(src: &RgbImage, width: usize, height: usize) -> RgbImage {
    assert!(
        width > 0 && height > 0 && src.width > 0 && src.height > 0,
        "empty resize"
    );
    let h_pass = if width != src.width {
        Some(horizontal(src, width, &coefficients(src.width, width)))
    } else {
        None
    };
    let mid = h_pass.as_ref().unwrap_or(src);
    if height != src.height {
        vertical(mid, height, &coefficients(src.height, height))
    } else {
        h_pass.unwrap_or_else(|| src.clone())
    }
}

/// `src` put into `width × height` by `mode` (see [`Fit`]).
pub fn fit(src: &RgbImage, width: usize, height: usize, mode: Fit) -> RgbImage {
    if (src.width, src.height) == (width, height) {
        return src.clone();
    }
    match mode {
        Fit::Stretch => resize_bicubic(src, width, height),
        Fit::PadCeil => {
            let (cw, ch) = pad_ceil_content(src.width, src.height, width, height);
            let content = resize_bicubic(src, cw, ch);
            let mut canvas = RgbImage::filled(width, height, [0, 0, 0]);
            let (ox, oy) = ((width - cw) / 2, (height - ch) / 2);
            for y in 0..ch {
                let dst = ((oy + y) * width + ox) * 3;
                canvas.data[dst..dst + cw * 3]
                    .copy_from_slice(&content.data[y * cw * 3..(y + 1) * cw * 3]);
            }
            canvas
        }
    }
}

/// The content size of [`Fit::PadCeil`] for a `w × h` image in a `tw × th` target, in f32
/// arithmetic as llama.cpp's C++ (`float scale`, `std::ceil(int · float)`).
pub fn pad_ceil_content(w: usize, h: usize, tw: usize, th: usize) -> (usize, usize) {
    let scale = (tw as f32 / w as f32).min(th as f32 / h as f32);
    let cw = ((w as f32 * scale).ceil() as usize).clamp(1, tw);
    let ch = ((h as f32 * scale).ceil() as usize).clamp(1, th);
    (cw, ch)
}
