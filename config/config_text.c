/* SPDX-License-Identifier: Apache-2.0 */
/*
 * config/config_text.c: what the ds_config.json reader needs from the text itself and jansson
 * does not give: the line of every key (jansson keeps no positions), the non-ASCII characters
 * outside strings that configurations copied from web pages carry (jansson only says "invalid
 * token"), and the edit distance for suggesting the nearest key. No JSON parsing beyond
 * tracking strings and nesting; the key scan runs only on text jansson accepted.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config_internal.h"

/* Past the closing quote of the string that starts at s[0] == '"'. */
static const char *
skip_string(const char *s, int *line)
{
	for (s++; *s && *s != '"'; s++) {
		if (*s == '\\' && s[1]) {
			s++;
		} else if (*s == '\n') {
			(*line)++;
		}
	}
	return *s ? s + 1 : s;
}

void
cfg_keylines_free(struct cfg_keyline *kl, size_t n)
{
	for (size_t i = 0; kl && i < n; i++) {
		zc_free(kl[i].path);
	}
	zc_free(kl);
}

int
cfg_keylines_scan(const char *text, struct cfg_keyline **out)
{
	struct {
		char type;
		size_t len;
	} st[64];
	char path[512] = "";
	size_t len = 0, n = 0, cap = 0;
	int top = -1, line = 1;
	bool expect_key = false;
	struct cfg_keyline *kl = NULL;

	for (const char *s = text; *s;) {
		char c = *s;
		if (c == '"') {
			const char *start = s + 1;
			int at = line;
			s = skip_string(s, &line);
			if (top < 0 || st[top].type != '{' || !expect_key) {
				continue;
			}
			expect_key = false;
			size_t klen = (size_t)(s - 1 - start);
			len = st[top].len;
			if (len + klen + 2 >= sizeof(path)) {
				continue; /* absurdly deep: no line for it */
			}
			if (len > 0) {
				path[len++] = '.';
			}
			memcpy(path + len, start, klen);
			len += klen;
			path[len] = '\0';
			if (n == cap) {
				size_t ncap = cap ? 2 * cap : 32;
				struct cfg_keyline *nk = zc_malloc(ncap * sizeof(*nk));
				if (!nk) {
					goto nomem;
				}
				if (kl) {
					memcpy(nk, kl, n * sizeof(*nk));
				}
				zc_free(kl);
				kl = nk;
				cap = ncap;
			}
			kl[n].path = zc_strdup(path);
			if (!kl[n].path) {
				goto nomem;
			}
			kl[n++].line = at;
			continue;
		}
		if (c == '\n') {
			line++;
		} else if ((c == '{' || c == '[') && top + 1 < (int)ZINF_ARRAY_SIZE(st)) {
			st[++top].type = c;
			st[top].len = len;
			expect_key = c == '{';
		} else if ((c == '}' || c == ']') && top >= 0) {
			top--;
			len = top >= 0 ? st[top].len : 0;
			path[len] = '\0';
		} else if (c == ',' && top >= 0 && st[top].type == '{') {
			expect_key = true;
		}
		s++;
	}
	*out = kl;
	return (int)n;
nomem:
	cfg_keylines_free(kl, n);
	return -ENOMEM;
}

int
cfg_keylines_find(const struct cfg_keyline *kl, size_t n, const char *path)
{
	char p[512];
	snprintf(p, sizeof(p), "%s", path);
	for (;;) {
		for (size_t i = 0; i < n; i++) {
			if (strcmp(kl[i].path, p) == 0) {
				return kl[i].line;
			}
		}
		char *dot = strrchr(p, '.');
		if (!dot) {
			return 0;
		}
		*dot = '\0';
	}
}

/* Decode one UTF-8 sequence at s; sets *len (1 on a malformed byte). */
static uint32_t
utf8_decode(const unsigned char *s, int *len)
{
	int n = s[0] >= 0xf0 ? 4 : s[0] >= 0xe0 ? 3 : s[0] >= 0xc0 ? 2 : 1;
	uint32_t cp = n == 1 ? s[0] : s[0] & (0x3f >> (n - 1));
	for (int i = 1; i < n; i++) {
		if ((s[i] & 0xc0) != 0x80) {
			*len = 1;
			return s[0];
		}
		cp = (cp << 6) | (s[i] & 0x3f);
	}
	*len = n;
	return cp;
}

static const struct {
	uint32_t cp;
	const char *name;
} char_names[] = {
	{0x00a0, "NO-BREAK SPACE"},
	{0x2002, "EN SPACE"},
	{0x2003, "EM SPACE"},
	{0x2007, "FIGURE SPACE"},
	{0x2009, "THIN SPACE"},
	{0x200b, "ZERO WIDTH SPACE"},
	{0x202f, "NARROW NO-BREAK SPACE"},
	{0x3000, "IDEOGRAPHIC SPACE"},
	{0xfeff, "ZERO WIDTH NO-BREAK SPACE (byte order mark)"},
	{0x2018, "LEFT SINGLE QUOTATION MARK"},
	{0x2019, "RIGHT SINGLE QUOTATION MARK"},
	{0x201c, "LEFT DOUBLE QUOTATION MARK"},
	{0x201d, "RIGHT DOUBLE QUOTATION MARK"},
};

const char *
cfg_char_name(uint32_t cp)
{
	for (size_t i = 0; i < ZINF_ARRAY_SIZE(char_names); i++) {
		if (char_names[i].cp == cp) {
			return char_names[i].name;
		}
	}
	return "a non-ASCII character";
}

int
cfg_first_non_ascii(const char *text, uint32_t *cp)
{
	const unsigned char *s = (const unsigned char *)text;
	for (int col = 1; *s; col++) {
		int len = 1;
		if (*s >= 0x80) {
			*cp = utf8_decode(s, &len);
			return col;
		}
		s += len;
	}
	return 0;
}

int
cfg_prescan(const char *text, const char *name)
{
	const unsigned char *s = (const unsigned char *)text;
	int line = 1, col = 1, found = 0;
	bool in_string = false;
	while (*s) {
		int len = 1;
		if (in_string) {
			if (*s == '\\' && s[1]) {
				len = 2;
				col++;
			} else if (*s == '"') {
				in_string = false;
			}
		} else if (*s == '"') {
			in_string = true;
		} else if (*s >= 0x80) {
			uint32_t cp = utf8_decode(s, &len);
			const char *what = cfg_char_name(cp);
			if (found < CFG_SHOWN) {
				ZINF_ERR("%s:%d:%d: U+%04X %s outside a string (JSON allows only "
					 "ASCII spaces, tabs, newlines and \" there; text copied "
					 "from a web page often carries it): replace it",
					 name, line, col, (unsigned)cp, what);
			}
			found++;
		}
		if (*s == '\n') {
			line++;
			col = 1;
		} else if ((*s & 0xc0) != 0x80 || len > 1) {
			col++;
		}
		s += len;
	}
	if (found > CFG_SHOWN) {
		ZINF_ERR("%s: %d non-ASCII characters outside strings (the first %d named)", name,
			 found, CFG_SHOWN);
	}
	return found;
}

size_t
cfg_edit_distance(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b);
	if (la > 63 || lb > 63) {
		return SIZE_MAX;
	}
	size_t d[64][64];
	for (size_t i = 0; i <= la; i++) {
		d[i][0] = i;
	}
	for (size_t j = 0; j <= lb; j++) {
		d[0][j] = j;
	}
	for (size_t i = 1; i <= la; i++) {
		for (size_t j = 1; j <= lb; j++) {
			size_t cost = a[i - 1] != b[j - 1];
			size_t v = ZINF_MIN(d[i - 1][j] + 1, d[i][j - 1] + 1);
			v = ZINF_MIN(v, d[i - 1][j - 1] + cost);
			if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
				v = ZINF_MIN(v, d[i - 2][j - 2] + 1);
			}
			d[i][j] = v;
		}
	}
	return d[la][lb];
}
