/*
 * How steady is a CPU-second here? Two threads each sleep 2 ms, then time
 * a fixed piece of work (a 3,000-step pointer chase with stores over a
 * 256 KiB buffer: no allocator, no device) on their thread CPU clock, as
 * `lab fio-aging`'s paced job threads time their calls. Prints one line
 * per 0.25 s window: its end (s) and each thread's mean CPU µs per piece.
 * The aging statistic (median of the last quarter after 1 s ÷ median of
 * the first) on 1 / µs is what `retained` alone would read for work that
 * cannot age (docs/LAB.md, `lab fio-aging`). SPIN=1 busy-waits instead of
 * sleeping.
 *
 *   cc -O2 -pthread scripts/cpu-drift-probe.c -o /tmp/probe && /tmp/probe
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define NW 24
#define WS 0.25

static double now(clockid_t c)
{
	struct timespec t;
	clock_gettime(c, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

static double t0;
static double acc[2][NW];
static long cnt[2][NW];

static void *run(void *arg)
{
	int id = (int)(intptr_t)arg;
	size_t n = 1 << 16;
	uint32_t *buf = malloc(n * 4);
	for (size_t i = 0; i < n; i++)
		buf[i] = (uint32_t)((i * 2654435761u) % n);
	uint32_t x = (uint32_t)id;
	for (;;) {
		double w = now(CLOCK_MONOTONIC) - t0;
		if (w >= NW * WS)
			break;
		int k = (int)(w / WS);
		if (getenv("SPIN")) {
			double e = now(CLOCK_MONOTONIC) + 0.002;
			while (now(CLOCK_MONOTONIC) < e)
				;
		} else {
			struct timespec s = { 0, 2000000 };
			nanosleep(&s, NULL);
		}
		double c0 = now(CLOCK_THREAD_CPUTIME_ID);
		for (int r = 0; r < 3000; r++) {
			x = buf[x];
			buf[(x * 7) % n] += (uint32_t)r;
		}
		double c1 = now(CLOCK_THREAD_CPUTIME_ID);
		acc[id][k] += c1 - c0;
		cnt[id][k]++;
	}
	return NULL;
}

int main(void)
{
	pthread_t th[2];
	t0 = now(CLOCK_MONOTONIC);
	for (int i = 0; i < 2; i++)
		pthread_create(&th[i], NULL, run, (void *)(intptr_t)i);
	for (int i = 0; i < 2; i++)
		pthread_join(th[i], NULL);
	for (int k = 0; k < NW; k++)
		printf("%.2f %.3f %.3f\n", (k + 1) * WS,
		       acc[0][k] / (cnt[0][k] ? cnt[0][k] : 1) * 1e6,
		       acc[1][k] / (cnt[1][k] ? cnt[1][k] : 1) * 1e6);
	return 0;
}
