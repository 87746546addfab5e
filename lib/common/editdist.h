/* editdist.h - how far apart two short names are, for "did you mean" suggestions (config
 * keys, command-line options). */
#ifndef CORE_EDITDIST_H
#define CORE_EDITDIST_H

#include <stddef.h>

/* Optimal string alignment distance (Levenshtein plus adjacent transposition), so that
 * "setps" is one edit from "steps". SIZE_MAX for names of 64 bytes or more: never close. */
size_t edit_distance(const char *a, const char *b);

#endif
