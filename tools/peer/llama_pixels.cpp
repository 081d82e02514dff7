// llama_pixels: llama.cpp's own preprocessed pixels for one image (issue 19, pixel parity).
//
// Built against the vendored llama.cpp of the peer (tools/peer/build_llama_cpp.sh) by
// tools/peer/pixel_fixtures.py; never part of CI, never committed as a binary.
//
// Usage: llama_pixels MMPROJ IMAGE MIN_TOKENS MAX_TOKENS OUT
//
// Loads the projector with clip_init (as mtmd_init_from_file does, image token limits
// MIN_TOKENS / MAX_TOKENS; 0 or less keeps the projector's defaults), decodes IMAGE with the
// stb_image that mtmd_helper_bitmap_init_from_buf uses (3 channels), runs the preprocessor
// mtmd picks for Qwen-VL projectors (mtmd_image_preprocessor_dyn_size: calc_size_preserved_ratio,
// img_tool::resize with the projector's algorithm and padding, clip_image_f32::from_u8 and
// normalize) and writes its single entry to OUT, little-endian:
//   [i32 src_nx][i32 src_ny][i32 nx][i32 ny][f32 ny*nx*3]
// the f32 values row-major, RGB interleaved ([y][x][c]), exactly the buffer clip encodes.
// Errors: a message on stderr and exit 1.

#include "clip.h"
#include "clip-impl.h"
#include "clip-model.h"
#include "mtmd-image.h"
#include "stb/stb_image.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <vector>

static int fail(const char * what) {
    std::fprintf(stderr, "llama_pixels: %s\n", what);
    return 1;
}

static void put_i32(std::FILE * f, int32_t v) {
    std::fwrite(&v, sizeof v, 1, f);
}

int main(int argc, char ** argv) {
    if (argc != 6) {
        return fail("usage: llama_pixels MMPROJ IMAGE MIN_TOKENS MAX_TOKENS OUT");
    }
    const char * mmproj = argv[1];
    const char * image  = argv[2];
    const int min_tokens = std::atoi(argv[3]);
    const int max_tokens = std::atoi(argv[4]);
    const char * out    = argv[5];

    std::ifstream in(image, std::ios::binary);
    if (!in) {
        return fail("cannot read the image");
    }
    std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    int nx = 0, ny = 0, nc = 0;
    unsigned char * rgb = stbi_load_from_memory(bytes.data(), (int) bytes.size(), &nx, &ny, &nc, 3);
    if (!rgb) {
        return fail("stb_image cannot decode the image");
    }
    clip_image_u8 img;
    img.set_size({nx, ny}, false);
    img.cpy_buf(std::vector<uint8_t>(rgb, rgb + (size_t) nx * ny * 3));
    stbi_image_free(rgb);

    clip_context_params params{};
    params.use_gpu          = false;
    params.device           = nullptr;
    params.flash_attn_type  = CLIP_FLASH_ATTN_TYPE_AUTO;
    params.image_min_tokens = min_tokens > 0 ? min_tokens : -1;
    params.image_max_tokens = max_tokens > 0 ? max_tokens : -1;
    params.warmup           = false;
    params.no_alloc         = false;
    clip_init_result res = clip_init(mmproj, params);
    if (!res.ctx_v) {
        return fail("clip_init gave no vision context");
    }
    if (clip_get_projector_type(res.ctx_v) != PROJECTOR_TYPE_QWEN3VL) {
        return fail("not a qwen3vl_merger projector (this tool runs mtmd's Qwen-VL preprocessor only)");
    }
    mtmd_image_preprocessor_dyn_size pre(res.ctx_v);
    mtmd_image_preproc_out po = pre.preprocess(img);
    if (po.entries.size() != 1) {
        return fail("the preprocessor gave other than one entry");
    }
    const clip_image_f32 & f = po.entries[0];
    const std::vector<float> & buf = f.get_ro_buf();

    std::FILE * o = std::fopen(out, "wb");
    if (!o) {
        return fail("cannot write OUT");
    }
    put_i32(o, nx);
    put_i32(o, ny);
    put_i32(o, f.nx());
    put_i32(o, f.ny());
    std::fwrite(buf.data(), sizeof(float), buf.size(), o);
    std::fclose(o);
    std::fprintf(stderr, "llama_pixels: %s %dx%d -> %dx%d (budget %d..%d tokens)\n", image, nx, ny, f.nx(), f.ny(),
                 min_tokens, max_tokens);
    clip_free(res.ctx_v);
    return 0;
}
