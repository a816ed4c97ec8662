// Builds of ggml's repacked one-row gemv (Q6_K or Q4_K) on a matrix past the caches: ms per pass.
//
// A one-row pass of a large matrix is limited by how fast one or two threads stream its weights
// from memory, and by how well a kernel's arithmetic overlaps those reads. This loads
// libggml-cpu.so from each build folder given (each in its own link namespace), fills 4 repacked
// weights of N_IN x N_OUT with random quants (fp16 scales set to a normal value) and one Q8_K
// row, and in each of ROUNDS rounds runs every build's ggml_gemv_<type>_8x8_q8_K over a whole
// weight on 1 thread and on 2 threads (the columns split in halves, as ggml splits them). The
// weights take turns so that no pass reads what the pass before it read (this machine's L3 is
// large), and each build meets each weight as often; some of a VM's memory streams slower than
// the rest, so the medians per weight are printed too. Also prints, for reference, the rate at
// which the same threads read a plain buffer of the weight's size (no arithmetic), with and
// without software prefetch, and each build's kernel on a weight that stays in L2 (arithmetic
// alone).
//
//   cc -O2 -march=native -pthread scripts/bench/gemv_stream.c -o /tmp/gemv_stream -ldl
//   /tmp/gemv_stream q6_K 2048 100352 12 BUILD_A/bin/libggml-cpu.so BUILD_B/bin/libggml-cpu.so
#define _GNU_SOURCE
#include <dlfcn.h>
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef void (*gemv_fn)(int, float *, size_t, const void *, const void *, int, int);

enum { BLOCK_Q8_K = 292, N_WEIGHTS = 4, MAX_LIBS = 8, MAX_ROUNDS = 64 };

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmp_double(const void * a, const void * b) {
    const double x = *(const double *) a, y = *(const double *) b;
    return x < y ? -1 : x > y;
}

struct job { gemv_fn fn; int n, nc; size_t block; const uint8_t * w; const uint8_t * y; float * s; int prefetch; };

static void * run_gemv(void * arg) {
    struct job * j = arg;
    j->fn(j->n, j->s, 0, j->w, j->y, 1, j->nc);
    return NULL;
}

// one pass over the weight's bytes: 64-byte loads added up, optionally prefetching 8 KiB ahead into L2
static void * run_read(void * arg) {
    struct job * j = arg;
    const size_t bytes = (size_t) j->nc / 8 * (j->n / 256) * j->block;
    __m256i acc = _mm256_setzero_si256();
    for (size_t i = 0; i < bytes; i += 64) {
        if (j->prefetch) _mm_prefetch((const char *) j->w + i + 8192, _MM_HINT_T1);
        acc = _mm256_add_epi8(acc, _mm256_loadu_si256((const __m256i *) (j->w + i)));
        acc = _mm256_add_epi8(acc, _mm256_loadu_si256((const __m256i *) (j->w + i + 32)));
    }
    j->s[0] = (float) _mm256_extract_epi8(acc, 0);
    return NULL;
}

// ms for one pass on nt threads, each taking its share of the columns
static double pass(void * (*fn)(void *), struct job base, int nt) {
    pthread_t th[2];
    struct job jobs[2];
    const int per = base.nc / nt;
    const double t0 = now();
    for (int k = 0; k < nt; k++) {
        jobs[k] = base;
        jobs[k].nc = per;
        jobs[k].w = base.w + (size_t) k * per / 8 * (base.n / 256) * base.block;
        jobs[k].s = base.s + (size_t) k * per;
        pthread_create(&th[k], NULL, fn, &jobs[k]);
    }
    for (int k = 0; k < nt; k++) pthread_join(th[k], NULL);
    return (now() - t0) * 1e3;
}

static void report(const char * name, double * t, int n) {
    qsort(t, n, sizeof(double), cmp_double);
    printf("  %s median %.2f [%.2f-%.2f]", name, t[n / 2], t[0], t[n - 1]);
}

int main(int argc, char ** argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: %s q6_K|q4_K N_IN N_OUT ROUNDS LIB... (N_IN a multiple of 256, N_OUT of 16)\n", argv[0]);
        return 2;
    }
    const int q6 = strcmp(argv[1], "q6_K") == 0;
    const size_t block = q6 ? 1680 : 1152;  // block_q6_Kx8, block_q4_Kx8
    const int n = atoi(argv[2]), nc = atoi(argv[3]), rounds = atoi(argv[4]), n_libs = argc - 5, nb = n / 256;
    if (n % 256 || nc % 16 || rounds < 1 || rounds > MAX_ROUNDS || n_libs > MAX_LIBS) { fprintf(stderr, "bad arguments\n"); return 2; }
    gemv_fn fns[MAX_LIBS];
    for (int i = 0; i < n_libs; i++) {
        void * h = dlmopen(LM_ID_NEWLM, argv[5 + i], RTLD_NOW | RTLD_LOCAL);
        if (!h) { fprintf(stderr, "%s\n", dlerror()); return 1; }
        fns[i] = (gemv_fn) dlsym(h, q6 ? "ggml_gemv_q6_K_8x8_q8_K" : "ggml_gemv_q4_K_8x8_q8_K");
        if (!fns[i]) { fprintf(stderr, "%s: no repacked %s gemv\n", argv[5 + i], argv[1]); return 1; }
    }
    const size_t nblk = (size_t) nc / 8 * nb, bytes = nblk * block;
    // 64 bytes of slack: the plain read takes whole lines, and a thread's share need not end on one
    uint8_t * w = aligned_alloc(4096, (bytes * N_WEIGHTS + 64 + 4095) / 4096 * 4096);
    srand(1);
    for (size_t i = 0; i < bytes * N_WEIGHTS; i++) w[i] = (uint8_t) rand();
    // the leading fp16 scales (Q6_K: d; Q4_K: d and dmin) to 2^-8, so no pass meets NaNs or denormals
    for (size_t c = 0; c < nblk * N_WEIGHTS; c++) {
        uint16_t * d = (uint16_t *) (w + c * block);
        for (int k = 0; k < (q6 ? 8 : 16); k++) d[k] = 0x1c00;
    }
    uint8_t * y = malloc((size_t) nb * BLOCK_Q8_K);
    for (size_t i = 0; i < (size_t) nb * BLOCK_Q8_K; i++) y[i] = (uint8_t) rand();
    for (int b = 0; b < nb; b++) { const float d = 0.01f; memcpy(y + (size_t) b * BLOCK_Q8_K, &d, sizeof d); }
    float * s = malloc((size_t) nc * sizeof(float));

    printf("%s %d x %d, %.1f MB a weight, %d rounds\n", argv[1], n, nc, bytes / 1e6, rounds);
    static double t[MAX_LIBS + 2][2][MAX_ROUNDS], per_w[MAX_LIBS + 2][2][N_WEIGHTS][MAX_ROUNDS];
    static int n_per_w[MAX_LIBS + 2][2][N_WEIGHTS];
    int turn = 0;
    for (int r = -1; r < rounds; r++) {  // round -1 touches every page once, untimed
        for (int i = 0; i < n_libs + 2; i++) {
            for (int nt = 1; nt <= 2; nt++) {
                const int wi = (turn++ + (r < 0 ? 0 : r)) % N_WEIGHTS;
                struct job base = { i < n_libs ? fns[i] : NULL, n, nc, block, w + wi * bytes, y, s, i == n_libs + 1 };
                const double ms = pass(i < n_libs ? run_gemv : run_read, base, nt);
                if (r >= 0) {
                    t[i][nt - 1][r] = ms;
                    per_w[i][nt - 1][wi][n_per_w[i][nt - 1][wi]++] = ms;
                }
            }
        }
    }
    for (int i = 0; i < n_libs + 2; i++) {
        printf("%s\n", i < n_libs ? argv[5 + i] : i == n_libs ? "plain read" : "plain read, prefetch 8 KiB ahead into L2");
        for (int nt = 1; nt <= 2; nt++) {
            report(nt == 1 ? "t1 ms" : "t2 ms", t[i][nt - 1], rounds);
            printf(" (%.1f GB/s); per weight:", bytes / t[i][nt - 1][rounds / 2] / 1e6);
            for (int wi = 0; wi < N_WEIGHTS; wi++) {
                const int m = n_per_w[i][nt - 1][wi];
                if (!m) continue;
                qsort(per_w[i][nt - 1][wi], m, sizeof(double), cmp_double);
                printf(" %.2f", per_w[i][nt - 1][wi][m / 2]);
            }
            printf("\n");
        }
    }
    // arithmetic alone: 64 columns (a weight of N_IN x 64 stays in L2), one thread, min of 2000
    printf("in L2 (%d x 64, one thread), ns per superblock of 8 columns:", n);
    for (int i = 0; i < n_libs; i++) {
        double best = 1e9;
        for (int k = 0; k < 2000; k++) {
            const double t0 = now();
            fns[i](n, s, 0, w, y, 1, 64);
            const double dt = now() - t0;
            if (dt < best) best = dt;
        }
        printf(" %.1f", best * 1e9 / (64 / 8 * nb));
    }
    printf("\n");
    return 0;
}
