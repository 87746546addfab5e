/* banned.h - functions with a safer spelling in this codebase (after git's banned.h).
 * Every .c file includes it last, after the system headers whose prototypes it would break;
 * using a banned function is then a build error. */
#ifndef CORE_BANNED_H
#define CORE_BANNED_H
#define BANNED(func) sorry_##func##_is_banned_in_this_codebase
#undef strcpy
#define strcpy(x, y) BANNED(strcpy)
#undef strcat
#define strcat(x, y) BANNED(strcat)
#undef sprintf
#define sprintf(...) BANNED(sprintf)
#undef vsprintf
#define vsprintf(...) BANNED(vsprintf)
#undef atoi
#define atoi(x) BANNED(atoi)
#undef atol
#define atol(x) BANNED(atol)
#undef atof
#define atof(x) BANNED(atof)
#undef gets
#define gets(x) BANNED(gets)
#endif
