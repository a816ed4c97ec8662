// Two builds of ggml's repacked Q4_K or Q8_0 gemv side by side in one process: time and bits.
//
// Loads libggml-cpu.so from two build folders (A, B), fills one repacked weight of N_IN x N_OUT
// (Q4_Kx8 against Q8_K rows, or Q8_0x4 against Q8_0 rows) and 16 rows with random values
// (weights and rows stay in the caches: this times the kernels' arithmetic, not memory), and for
// 1, 2, 5, 9 and 16 rows calls A's and B's one-row gemv (ggml_gemv_q4_K_8x8_q8_K,
// ggml_gemv_q8_0_4x8_q8_0) or rows gemv (..._rows: patches 0011, 0018), alternating, 60 times
// each; prints the minimum time of each (the least disturbed by a shared machine) and whether
// the two outputs have the same bits. The type defaults to q4_K.
//
//   cc -O2 scripts/bench/gemv_ab.c -o /tmp/gemv_ab -ldl
//   LD_LIBRARY_PATH=LIBDIR_A /tmp/gemv_ab [q4_K|q8_0] LIBDIR_A/libggml-cpu.so LIBDIR_B/libggml-cpu.so 2048 512
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef void (*gemv_fn)(int, float *, size_t, const void *, const void *, int, int);
typedef void (*gemv_rows_fn)(int, float * const *, const void *, const void * const *, int, int);

enum { BLOCK_Q4_KX8 = 1152, BLOCK_Q8_K = 292, BLOCK_Q8_0X4 = 136, BLOCK_Q8_0 = 34, MAX_ROWS = 16, TRIES = 60 };

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

// random bytes for a repacked weight of nblk blocks, each block's leading n_half fp16 scales set
// to small positive values
static uint8_t * random_weights(size_t nblk, size_t block, int n_half) {
    uint8_t * w = malloc(nblk * block);
    for (size_t i = 0; i < nblk * block; i++) w[i] = (uint8_t) rand();
    for (size_t c = 0; c < nblk; c++) {
        uint16_t * d = (uint16_t *) (w + c * block);
        for (int k = 0; k < n_half; k++) d[k] = (uint16_t) (0x2000 + (rand() & 0xff));  // small positive halves
    }
    return w;
}

int main(int argc, char ** argv) {
    const int typed = argc == 6;
    const char * type = typed ? argv[1] : "q4_K";
    const int q8_0 = strcmp(type, "q8_0") == 0;
    if ((argc != 5 && argc != 6) || (!q8_0 && strcmp(type, "q4_K"))) {
        fprintf(stderr, "usage: %s [q4_K|q8_0] LIB_A LIB_B N_IN N_OUT (q4_K: N_IN a multiple of 256, N_OUT of 8; "
                        "q8_0: of 32 and 4)\n", argv[0]);
        return 2;
    }
    char ** args = argv + typed;
    const int n = atoi(args[3]), nc = atoi(args[4]);
    const char * one_name = q8_0 ? "ggml_gemv_q8_0_4x8_q8_0" : "ggml_gemv_q4_K_8x8_q8_K";
    char rows_name[64];
    snprintf(rows_name, sizeof(rows_name), "%s_rows", one_name);
    gemv_fn one[2];
    gemv_rows_fn rows[2];
    for (int i = 0; i < 2; i++) {
        void * h = dlopen(args[1 + i], RTLD_NOW | RTLD_LOCAL);
        if (!h) { fprintf(stderr, "%s\n", dlerror()); return 1; }
        one[i] = (gemv_fn) dlsym(h, one_name);
        rows[i] = (gemv_rows_fn) dlsym(h, rows_name);
        if (!one[i] || !rows[i]) { fprintf(stderr, "%s: no %s (or no %s)\n", args[1 + i], one_name, rows_name); return 1; }
        // fills the fp16 table that a Q8_0 row's scale is read through: without it every
        // Q8_0 output is zero, and two builds agree whatever they compute
        void (*cpu_init)(void) = (void (*)(void)) dlsym(h, "ggml_cpu_init");
        if (cpu_init) cpu_init();
    }
    srand(1);
    uint8_t * w;
    uint8_t * a;
    size_t row_bytes;
    if (q8_0) {
        // block_q8_0x4: 4 fp16 d, 128 quants; block_q8_0: fp16 d, 32 quants
        const int nb = n / 32;
        w = random_weights((size_t) nc / 4 * nb, BLOCK_Q8_0X4, 4);
        row_bytes = (size_t) BLOCK_Q8_0 * nb;
        a = malloc(row_bytes * MAX_ROWS);
        for (int r = 0; r < MAX_ROWS; r++) {
            for (int b = 0; b < nb; b++) {
                uint8_t * blk = a + r * row_bytes + (size_t) b * BLOCK_Q8_0;
                const uint16_t d = (uint16_t) (0x2000 + (rand() & 0xff));
                memcpy(blk, &d, 2);
                for (int k = 0; k < 32; k++) blk[2 + k] = (uint8_t) ((rand() % 255) - 127);
            }
        }
    } else {
        // block_q4_Kx8: 8 fp16 d, 8 fp16 dmin, 96 bytes of scales and mins, 1024 of quants
        const int nb = n / 256;
        w = random_weights((size_t) nc / 8 * nb, BLOCK_Q4_KX8, 16);
        // block_q8_K: float d, 256 quants, 16 int16 sums of 16 quants
        row_bytes = (size_t) BLOCK_Q8_K * nb;
        a = malloc(row_bytes * MAX_ROWS);
        for (int r = 0; r < MAX_ROWS; r++) {
            for (int b = 0; b < nb; b++) {
                uint8_t * blk = a + r * row_bytes + (size_t) b * BLOCK_Q8_K;
                const float d = 0.01f;
                memcpy(blk, &d, 4);
                for (int k = 0; k < 256; k++) blk[4 + k] = (uint8_t) ((rand() % 255) - 127);
                for (int k = 0; k < 16; k++) {
                    int16_t sum = 0;
                    for (int j = 0; j < 16; j++) sum += (int8_t) blk[4 + 16 * k + j];
                    memcpy(blk + 260 + 2 * k, &sum, 2);
                }
            }
        }
    }
    float * out[2];
    for (int i = 0; i < 2; i++) out[i] = malloc(sizeof(float) * nc * MAX_ROWS);
    const int row_counts[] = { 1, 2, 5, 9, 16 };
    for (size_t k = 0; k < sizeof(row_counts) / sizeof(row_counts[0]); k++) {
        const int nr = row_counts[k];
        double best[2] = { 1e9, 1e9 };
        for (int t = 0; t < TRIES; t++) {
            for (int i = 0; i < 2; i++) {
                float * s[MAX_ROWS];
                const void * y[MAX_ROWS];
                for (int r = 0; r < nr; r++) { s[r] = out[i] + r * nc; y[r] = a + r * row_bytes; }
                const double t0 = now();
                if (nr == 1) one[i](n, out[i], nc, w, a, 1, nc); else rows[i](n, s, w, y, nr, nc);
                const double dt = now() - t0;
                if (dt < best[i]) best[i] = dt;
            }
        }
        const int same = memcmp(out[0], out[1], sizeof(float) * nc * nr) == 0;
        printf("rows %2d: A %.3f ms  B %.3f ms  B/A %.2f  bits %s\n", nr, best[0] * 1e3, best[1] * 1e3,
               best[1] / best[0], same ? "same" : "DIFFER");
    }
    return 0;
}
