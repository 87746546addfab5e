/* a2a_cases.h - the All-to-All cases test_dist.c (host, MPI) and test_dist_dev.c (device,
 * NCCL) share: the byte pattern every piece carries, a case's span shapes, the send buffer,
 * the receive buffer it must become (dist.h's span formula written out again, not taken from
 * the library), and the comparison that decodes the first difference. Static, for the two test
 * programs only: they define q, W (this rank, the world), nchecks and failed() before
 * including it. */
#ifndef CORE_TEST_A2A_CASES_H
#define CORE_TEST_A2A_CASES_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

enum { SENTINEL = 0xa5 };

/* The byte k of row `row` of block b of the piece that rank src sends to rank dst. */
static unsigned char pattern(int src, int dst, int b, int64_t row, size_t k)
{
	uint32_t h = 2166136261u;
	const uint32_t v[5] = {(uint32_t)src, (uint32_t)dst, (uint32_t)b, (uint32_t)row,
			       (uint32_t)k};
	for (int i = 0; i < 5; i++)
		h = (h ^ v[i]) * 16777619u;
	h ^= h >> 13;
	h *= 0x5bd1e995u;
	return (unsigned char)(h ^ h >> 15);
}

struct xcase {
	int nblk;
	int64_t n;
	size_t rb;
	struct {
		int64_t rows, row0;
		int inter;
	} s, r;
};

static void case_name(char *buf, size_t len, const struct xcase *c)
{
	static const char *const how[] = {"contiguous", "interleaved"};

	snprintf(buf, len, "nblk=%d n=%lld row_bytes=%zu send(rows=%lld row0=%lld %s) "
		 "recv(rows=%lld row0=%lld %s)", c->nblk, (long long)c->n, c->rb,
		 (long long)c->s.rows, (long long)c->s.row0, how[c->s.inter],
		 (long long)c->r.rows, (long long)c->r.row0, how[c->r.inter]);
}

/* The first row, in a buffer of rows-row blocks, of block b of peer p (dist.h's formula,
 * written out again here rather than taken from the library). */
static int64_t block_row(int inter, int64_t rows, int nblk, int p, int b)
{
	return (inter ? (int64_t)b * W + p : (int64_t)p * nblk + b) * rows;
}

static size_t buf_bytes(int64_t rows, const struct xcase *c)
{
	return (size_t)W * (size_t)c->nblk * (size_t)rows * c->rb;
}

/* Every row of every block of the send buffer, those outside the piece included. */
static void fill_send(unsigned char *s, const struct xcase *c)
{
	for (int p = 0; p < W; p++)
		for (int b = 0; b < c->nblk; b++)
			for (int64_t r = 0; r < c->s.rows; r++) {
				unsigned char *row = s + (size_t)(block_row(c->s.inter, c->s.rows,
							c->nblk, p, b) + r) * c->rb;
				for (size_t k = 0; k < c->rb; k++)
					row[k] = pattern(q, p, b, r, k);
			}
}

/* What the recv buffer must hold: the sentinel, and the pieces sent to this rank. */
static void fill_expected(unsigned char *e, const struct xcase *c)
{
	memset(e, SENTINEL, buf_bytes(c->r.rows, c));
	for (int p = 0; p < W; p++)
		for (int b = 0; b < c->nblk; b++)
			for (int64_t i = 0; i < c->n; i++) {
				unsigned char *row = e + (size_t)(block_row(c->r.inter, c->r.rows,
							c->nblk, p, b) + c->r.row0 + i) * c->rb;
				for (size_t k = 0; k < c->rb; k++)
					row[k] = pattern(p, q, b, c->s.row0 + i, k);
			}
}

/* Compare a recv buffer with what it must hold; the first difference is decoded. */
static void compare(const char *what, const unsigned char *got, const unsigned char *want,
		    const struct xcase *c)
{
	const size_t bytes = buf_bytes(c->r.rows, c);
	size_t i = 0;
	char name[256];

	while (i < bytes && got[i] == want[i])
		i++;
	nchecks++;
	if (i == bytes)
		return;
	case_name(name, sizeof name, c);
	size_t row = i / c->rb;
	int64_t blk = (int64_t)row / c->r.rows, r = (int64_t)row % c->r.rows;
	int p = c->r.inter ? (int)(blk % W) : (int)(blk / c->nblk);
	int b = c->r.inter ? (int)(blk / W) : (int)(blk % c->nblk);
	failed("%s, %s: byte %zu (peer %d block %d row %lld byte %zu) is 0x%02x, expected "
	       "0x%02x", what, name, i, p, b, (long long)r, i % c->rb, got[i], want[i]);
}

#endif
