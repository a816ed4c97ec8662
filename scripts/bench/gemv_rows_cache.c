// Is a repacked Q4_K or Q6_K rows kernel bound by its arithmetic or by memory? ms per call and
// GMAC/s of one build's ggml_gemv_<type>_8x8_q8_K (one row) and ggml_gemv_<type>_8x8_q8_K_rows
// (2-16 rows), on one thread, for a weight that stays in L2 (arithmetic alone) and one past the
// caches (N_WEIGHTS weights taking turns, so no call reads what the one before it read).
// Where the two rates agree, reading the weights is not what bounds the kernel.
//
//   cc -O2 -march=native scripts/bench/gemv_rows_cache.c -o /tmp/gemv_rows_cache -ldl
//   /tmp/gemv_rows_cache q4_K BUILD/lib/libggml-cpu.so > rows-cache.json
//
// Prints one JSON object: per case (cache, rows) the best ms of REPS timed passes and its GMAC/s.
// Weights are random quants with their fp16 scales set to normal values; rows are random Q8_K.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef void (*gemv_fn)(int, float *, size_t, const void *, const void *, int, int);
typedef void (*rows_fn)(int, float * const *, const void *, const void * const *, int, int);

enum { N_IN = 2048, BLOCK_Q8_K = 292, N_WEIGHTS = 4, REPS = 7, MAX_ROWS = 16 };

// a /proc/cpuinfo line's value ("model name", "flags"), for the record: rates differ between CPUs
static void cpuinfo(const char * key, char * out, size_t n) {
    char line[8192];
    out[0] = 0;
    FILE * f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    while (fgets(line, sizeof(line), f)) {
        char * colon = strchr(line, ':');
        if (colon && strncmp(line, key, strlen(key)) == 0) {
            snprintf(out, n, "%s", colon + 2);
            out[strcspn(out, "\n")] = 0;
            break;
        }
    }
    fclose(f);
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char ** argv) {
    if (argc != 3 || (strcmp(argv[1], "q4_K") && strcmp(argv[1], "q6_K"))) {
        fprintf(stderr, "usage: %s q4_K|q6_K path/to/libggml-cpu.so\n", argv[0]);
        return 2;
    }
    const int q4 = strcmp(argv[1], "q4_K") == 0;
    // bytes of 8 columns x 256 inputs, and where its 8 (Q6_K) or 16 (Q4_K) fp16 scales sit
    const size_t block = q4 ? 1152 : 1680;
    const int n_scales = q4 ? 16 : 8;
    void * lib = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "%s: %s\n", argv[2], dlerror());
        return 2;
    }
    char name[64];
    snprintf(name, sizeof(name), "ggml_gemv_%s_8x8_q8_K", argv[1]);
    gemv_fn one = (gemv_fn) dlsym(lib, name);
    snprintf(name, sizeof(name), "ggml_gemv_%s_8x8_q8_K_rows", argv[1]);
    rows_fn rows = (rows_fn) dlsym(lib, name);
    if (!one || !rows) {
        fprintf(stderr, "%s: no %s (a build without the rows kernels?)\n", argv[2], name);
        return 2;
    }
    const int nb = N_IN / 256;
    // in L2: 64 outputs (74 KB of Q4_K); past the caches: N_WEIGHTS x 32,768 outputs (38 MB each for Q4_K)
    const int n_out[2] = { 64, 32768 };
    const int n_weights[2] = { 1, N_WEIGHTS };
    const char * cache[2] = { "L2", "memory" };
    void * y[MAX_ROWS];
    float * s[MAX_ROWS];
    srand(1);
    for (int r = 0; r < MAX_ROWS; r++) {
        uint8_t * q = aligned_alloc(64, nb * BLOCK_Q8_K + 64);
        for (int b = 0; b < nb; b++) {
            const float d = 0.01f;
            memcpy(q + b * BLOCK_Q8_K, &d, 4);
            for (int i = 0; i < 256; i++) q[b * BLOCK_Q8_K + 4 + i] = (uint8_t) (rand() % 255 - 127);
            memset(q + b * BLOCK_Q8_K + 260, 0, 32);  // bsums: only their cost matters here
        }
        y[r] = q;
        s[r] = aligned_alloc(64, 32768 * sizeof(float));
    }
    const int row_counts[] = { 1, 2, 4, 8, 16 };
    static char model[256], flags[8192];
    cpuinfo("model name", model, sizeof(model));
    cpuinfo("flags", flags, sizeof(flags));
    printf("{\"type\": \"%s\", \"library\": \"%s\", \"cpu\": {\"model\": \"%s\", \"flags\": \"%s\", \"cores\": %ld}, "
           "\"n_in\": %d, \"threads\": 1, \"cases\": [", argv[1], argv[2], model, flags, sysconf(_SC_NPROCESSORS_ONLN), N_IN);
    for (int c = 0; c < 2; c++) {
        const size_t bytes = (size_t) (n_out[c] / 8) * nb * block;
        uint8_t * w[N_WEIGHTS];
        for (int k = 0; k < n_weights[c]; k++) {
            w[k] = aligned_alloc(64, bytes);
            for (size_t i = 0; i < bytes; i++) w[k][i] = (uint8_t) rand();
            for (size_t g = 0; g < bytes / block; g++) {
                uint16_t * d = (uint16_t *) (w[k] + g * block);
                for (int i = 0; i < n_scales; i++) d[i] = 0x2000 + (rand() % 256);  // small normal fp16
            }
        }
        const int calls = c == 0 ? 2000 : 8;
        for (size_t ri = 0; ri < sizeof(row_counts) / sizeof(row_counts[0]); ri++) {
            const int nr = row_counts[ri];
            double best = 1e30;
            for (int rep = 0; rep < REPS; rep++) {
                const double t0 = now();
                for (int i = 0; i < calls; i++) {
                    const void * wk = w[i % n_weights[c]];
                    if (nr == 1) one(N_IN, s[0], 0, wk, y[0], 1, n_out[c]);
                    else rows(N_IN, s, wk, (const void * const *) y, nr, n_out[c]);
                }
                const double t = (now() - t0) / calls;
                if (t < best) best = t;
            }
            printf("%s{\"cache\": \"%s\", \"n_out\": %d, \"rows\": %d, \"ms\": %.5f, \"gmac_per_s\": %.2f}",
                   c + ri == 0 ? "" : ", ", cache[c], n_out[c], nr, best * 1e3, (double) N_IN * n_out[c] * nr / best / 1e9);
            fflush(stdout);
        }
        for (int k = 0; k < n_weights[c]; k++) free(w[k]);
    }
    printf("]}\n");
    return 0;
}
