// The round trip of one cache line between two CPUs: how far apart the host has put them.
//
// Two threads, pinned to CPU A and CPU B, hand a counter back and forth through one cache line
// ROUNDS times; prints the mean nanoseconds of one round trip (A writes, B sees it and answers, A
// sees the answer). Two cores that share a level-3 cache answer in tens of nanoseconds, two on
// different dies or sockets in hundreds. On a VM the host moves the virtual CPUs, so the figure can
// change from one run to the next; a barrier between ggml's threads costs about one round trip.
//
//   cc -O2 -pthread scripts/bench/core_round_trip.c -o /tmp/core_round_trip
//   /tmp/core_round_trip [CPU_A CPU_B [ROUNDS]]        # defaults: 0 1 500000
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static _Alignas(64) atomic_long turn;
static long rounds;

static int pin(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    return pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

static void * answer(void * cpu) {
    if (pin(*(int *) cpu) != 0) {
        fprintf(stderr, "core_round_trip: cannot run on CPU %d\n", *(int *) cpu);
        exit(2);
    }
    for (long i = 0; i < rounds; i++) {
        while (atomic_load_explicit(&turn, memory_order_acquire) != 2 * i + 1) {
        }
        atomic_store_explicit(&turn, 2 * i + 2, memory_order_release);
    }
    return NULL;
}

int main(int argc, char ** argv) {
    int cpu_a = argc > 2 ? atoi(argv[1]) : 0, cpu_b = argc > 2 ? atoi(argv[2]) : 1;
    rounds = argc > 3 ? atol(argv[3]) : 500000;
    if (rounds < 1) {
        fprintf(stderr, "core_round_trip: ROUNDS: expected >= 1, found %ld\n", rounds);
        return 2;
    }
    if (pin(cpu_a) != 0) {
        fprintf(stderr, "core_round_trip: cannot run on CPU %d\n", cpu_a);
        return 2;
    }
    pthread_t other;
    pthread_create(&other, NULL, answer, &cpu_b);
    // one untimed exchange: both threads running where they were pinned
    atomic_store_explicit(&turn, 1, memory_order_release);
    while (atomic_load_explicit(&turn, memory_order_acquire) != 2) {
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long i = 1; i < rounds; i++) {
        atomic_store_explicit(&turn, 2 * i + 1, memory_order_release);
        while (atomic_load_explicit(&turn, memory_order_acquire) != 2 * i + 2) {
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    pthread_join(other, NULL);
    double ns = (t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec);
    printf("%.1f\n", rounds > 1 ? ns / (rounds - 1) : 0.0);
    return 0;
}
