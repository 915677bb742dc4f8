/* One-pass scanner of Kineto / Chrome trace events into column buffers (tracekit.ingest.kscan).
 *
 * Contract (the Python side, kscan.py, owns the semantics; this file only implements them):
 *  - input: the events of one chunk of a trace's "traceEvents" array, either bracketed ("[e, e]") or
 *    bare ("e, e"); the whole text is validated as strict JSON (RFC 8259 number grammar, string
 *    escapes, UTF-8, nothing after the last event);
 *  - every event is classified from its "ph" and "cat" with the tables the caller passes (kinds,
 *    skipped categories, known phases); kept events become one row each: the fields the trace schema
 *    reads, numbers as int64 (times as exact ns from their decimal text), strings unescaped and
 *    dictionary-encoded per column (codes + a dictionary in Arrow layout); every other key is skipped;
 *  - a value the fast path does not model (a non-integer pid, a timestamp in exponent notation, a
 *    recorded shape, a key spelled with escapes...) on a kept row makes the call return
 *    SCAN_UNSUPPORTED: the caller then decodes the chunk with its exact decoder, so rows never depend
 *    on this file for anything but the common case;
 *  - an event whose name starts with the caller's module prefix ("nn.Module: ", a module range of a
 *    with_stack / with_modules trace, which the category tables cannot keep) makes the call return
 *    SCAN_MODULE: the caller then decodes the chunk with a reader that keeps module ranges.
 * No allocation, no global state: calls on different buffers run in parallel threads.
 */
#include <stdint.h>
#include <string.h>

#define SCAN_SYNTAX (-1)
#define SCAN_CAPACITY (-2)
#define SCAN_UNSUPPORTED (-3)
#define SCAN_MODULE (-4)
#define KIND_UNKNOWN_CAT (-2)
#define KIND_UNKNOWN_PH (-3)
#define KIND_DROP (-100)
#define CODE_NULL (-1)
#define CODE_ODD (-2)

enum { F_PID, F_TID, F_TS, F_DUR, F_CORR, F_EXT, F_DEV, F_STREAM, F_REGS, F_SHMEM, F_BYTES, F_GRAPH,
       F_GNODE, F_INN, F_OUTN, F_GSIZE, F_SEQ, F_GX, F_GY, F_GZ, F_BX, F_BY, F_BZ, N_NUM };
enum { S_PH, S_CAT, S_NAME, S_COLL, S_DTYPE, S_PGN, S_PGD, S_PGR, N_STR };
/* value status: absent/null, a value, a value the fast path does not model */
enum { ST_NULL = 0, ST_OK = 1, ST_ODD = 2 };

#define MAX_DEPTH 512
/* categories / phases whose classification is cached by dictionary code */
#define N_CLASS 1024

/* The caller's buffers (kscan.py's _Out mirrors this layout). */
typedef struct {
    int64_t cap;      /* rows */
    int64_t hcap;     /* bytes per string heap */
    int64_t tsize;    /* hash slots per string column (a power of 2); a dictionary holds at most tsize / 2 */
    int64_t *num;     /* [N_NUM][cap] values (set where the status is ST_OK) */
    uint8_t *nst;     /* [cap][N_NUM] statuses */
    int32_t *code;    /* [N_STR][cap] dictionary codes, CODE_NULL, CODE_ODD */
    int32_t *doff;    /* [N_STR][tsize / 2 + 1] dictionary offsets into the heap */
    int64_t *ndict;   /* [N_STR] dictionary sizes */
    uint8_t *heap;    /* [N_STR][hcap] */
    int32_t *table;   /* [N_STR][tsize] scratch */
    int8_t *kind;     /* [cap] */
    uint8_t *shapes;  /* [cap] the row needs the exact reader: Input Dims / Input type recorded, args no object */
    int64_t rows;     /* out */
    int64_t stop;     /* out: byte offset where the scan stopped */
    int64_t why;      /* out: SCAN_CAPACITY: 1 rows, 2 a dictionary */
} Out;

typedef struct {
    const uint8_t *p, *end;
    Out *o;
    int64_t row;
    int64_t hpos[N_STR];
    int8_t catcls[N_CLASS], phcls[N_CLASS];
    const uint8_t *cats, *phases;
    const uint8_t *module;  /* the module-range name prefix, module_len bytes (0: none) */
    int64_t module_len;
    int instant_kind;
    int err;
} Scan;

static inline int is_ws(uint8_t c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }
static inline void skip_ws(Scan *s) { while (s->p < s->end && is_ws(*s->p)) s->p++; }
static inline int fail(Scan *s, int code) { if (!s->err) s->err = code; return 0; }

/* ---- strings ------------------------------------------------------------------------------ */

static int hexval(uint8_t c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int read_hex4(const uint8_t *q, const uint8_t *end, uint32_t *out) {
    if (end - q < 4) return 0;
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(q[i]);
        if (h < 0) return 0;
        v = (v << 4) | (uint32_t)h;
    }
    *out = v;
    return 1;
}

/* Length of the valid UTF-8 sequence at q (lead byte >= 0x80), or 0. */
static int utf8_len(const uint8_t *q, const uint8_t *end) {
    uint8_t c = q[0];
    int n;
    uint32_t cp;
    if (c >= 0xC2 && c <= 0xDF) { n = 2; cp = c & 0x1F; }
    else if (c >= 0xE0 && c <= 0xEF) { n = 3; cp = c & 0x0F; }
    else if (c >= 0xF0 && c <= 0xF4) { n = 4; cp = c & 0x07; }
    else return 0;
    if (end - q < n) return 0;
    for (int i = 1; i < n; i++) {
        if ((q[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (q[i] & 0x3F);
    }
    if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF))) return 0;
    if (cp >= 0xD800 && cp <= 0xDFFF) return 0;
    return n;
}

static uint8_t *put_utf8(uint8_t *o, uint32_t cp) {
    if (cp < 0x80) { *o++ = (uint8_t)cp; }
    else if (cp < 0x800) { *o++ = (uint8_t)(0xC0 | (cp >> 6)); *o++ = (uint8_t)(0x80 | (cp & 0x3F)); }
    else if (cp < 0x10000) {
        *o++ = (uint8_t)(0xE0 | (cp >> 12)); *o++ = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        *o++ = (uint8_t)(0x80 | (cp & 0x3F));
    } else {
        *o++ = (uint8_t)(0xF0 | (cp >> 18)); *o++ = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
        *o++ = (uint8_t)(0x80 | ((cp >> 6) & 0x3F)); *o++ = (uint8_t)(0x80 | (cp & 0x3F));
    }
    return o;
}

#define ONES 0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL

/* The first byte at or after q that is '"', '\\', a control character or non-ASCII (8 bytes a step). */
static inline const uint8_t *next_special(const uint8_t *q, const uint8_t *end) {
    while (end - q >= 8) {
        uint64_t x;
        memcpy(&x, q, 8);
        uint64_t quote = x ^ (ONES * 0x22), bslash = x ^ (ONES * 0x5C);
        uint64_t m = ((quote - ONES) & ~quote) | ((bslash - ONES) & ~bslash) | (x - ONES * 0x20) | x;
        m &= HIGHS;
        if (m) return q + (__builtin_ctzll(m) >> 3);
        q += 8;
    }
    while (q < end && *q != '"' && *q != '\\' && *q >= 0x20 && *q < 0x80) q++;
    return q;
}

/* Parse the string at s->p (on its opening quote). out != NULL: the unescaped bytes go there and
 * *olen is their count. *raw and *rlen: the bytes between the quotes; *esc: whether it held an escape. */
static int parse_string(Scan *s, uint8_t *out, int64_t *olen, const uint8_t **raw, int64_t *rlen, int *esc) {
    const uint8_t *q = s->p + 1, *end = s->end;
    uint8_t *o = out;
    const uint8_t *run = q;
    *esc = 0;
    while (1) {
        q = next_special(q, end);
        if (q >= end) return fail(s, SCAN_SYNTAX);
        uint8_t c = *q;
        if (c == '"') break;
        if (c < 0x20) return fail(s, SCAN_SYNTAX);
        if (c >= 0x80) {
            int n = utf8_len(q, end);
            if (!n) return fail(s, SCAN_SYNTAX);
            q += n;
            continue;
        }
        /* backslash */
        *esc = 1;
        if (o) { memcpy(o, run, (size_t)(q - run)); o += q - run; }
        if (end - q < 2) return fail(s, SCAN_SYNTAX);
        uint8_t ch = 0;
        switch (q[1]) {
            case '"': ch = '"'; break;
            case '\\': ch = '\\'; break;
            case '/': ch = '/'; break;
            case 'b': ch = '\b'; break;
            case 'f': ch = '\f'; break;
            case 'n': ch = '\n'; break;
            case 'r': ch = '\r'; break;
            case 't': ch = '\t'; break;
            case 'u': {
                uint32_t cp, lo;
                if (!read_hex4(q + 2, end, &cp)) return fail(s, SCAN_SYNTAX);
                q += 6;
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    if (end - q < 6 || q[0] != '\\' || q[1] != 'u' || !read_hex4(q + 2, end, &lo) || lo < 0xDC00 || lo > 0xDFFF)
                        return fail(s, SCAN_UNSUPPORTED); /* a lone surrogate: the exact decoder decides */
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    q += 6;
                } else if ((cp >= 0xDC00 && cp <= 0xDFFF) || cp == 0) {
                    return fail(s, SCAN_UNSUPPORTED); /* a lone low surrogate, or a NUL */
                }
                if (o) o = put_utf8(o, cp);
                run = q;
                continue;
            }
            default: return fail(s, SCAN_SYNTAX);
        }
        if (o) *o++ = ch;
        q += 2;
        run = q;
    }
    if (o) { memcpy(o, run, (size_t)(q - run)); o += q - run; *olen = o - out; }
    *raw = s->p + 1;
    *rlen = q - (s->p + 1);
    s->p = q + 1;
    return 1;
}

/* ---- numbers ------------------------------------------------------------------------------ */

typedef struct {
    int neg, has_frac, has_exp;
    const uint8_t *ip, *fp;  /* integer / fraction digits */
    int ni, nf;
} Num;

/* Strict JSON number at s->p. */
static int parse_number(Scan *s, Num *n) {
    const uint8_t *q = s->p, *end = s->end;
    n->neg = n->has_frac = n->has_exp = 0;
    n->nf = 0;
    n->fp = NULL;
    if (q < end && *q == '-') { n->neg = 1; q++; }
    if (q >= end || *q < '0' || *q > '9') return fail(s, SCAN_SYNTAX);
    n->ip = q;
    if (*q == '0') q++;
    else while (q < end && *q >= '0' && *q <= '9') q++;
    n->ni = (int)(q - n->ip);
    if (q < end && *q == '.') {
        q++;
        n->fp = q;
        while (q < end && *q >= '0' && *q <= '9') q++;
        n->nf = (int)(q - n->fp);
        if (!n->nf) return fail(s, SCAN_SYNTAX);
        n->has_frac = 1;
    }
    if (q < end && (*q == 'e' || *q == 'E')) {
        q++;
        if (q < end && (*q == '+' || *q == '-')) q++;
        const uint8_t *d = q;
        while (q < end && *q >= '0' && *q <= '9') q++;
        if (q == d) return fail(s, SCAN_SYNTAX);
        n->has_exp = 1;
    }
    if (q < end && !is_ws(*q) && *q != ',' && *q != '}' && *q != ']') return fail(s, SCAN_SYNTAX);
    s->p = q;
    return 1;
}

static int64_t digits(const uint8_t *q, int n) {
    int64_t v = 0;
    for (int i = 0; i < n; i++) v = v * 10 + (q[i] - '0');
    return v;
}

/* An integer literal as int64: ST_OK, or ST_ODD (a fraction, an exponent, more than 18 digits). */
static int num_int(const Num *n, int64_t *out) {
    if (n->has_frac || n->has_exp || n->ni > 18) return ST_ODD;
    int64_t v = digits(n->ip, n->ni);
    *out = n->neg ? -v : v;
    return ST_OK;
}

/* µs below which ns stay clear of the limit the exact reader refuses (2^62 ns, kineto_checks.MAX_TIME_NS) */
#define MAX_TIME_US 4611686018427386LL

/* µs decimal -> ns: the first three fraction digits, rounded half up on the fourth (the exact decoder's rule). */
static int num_us_to_ns(const Num *n, int64_t *out) {
    if (n->has_exp || n->ni > 18) return ST_ODD;
    int64_t us = digits(n->ip, n->ni);
    if (us >= MAX_TIME_US) return ST_ODD; /* the exact reader names the event */
    int64_t v = us * 1000;
    int64_t f = 0;
    for (int i = 0; i < 3; i++) f = f * 10 + (i < n->nf ? n->fp[i] - '0' : 0);
    v += f + (n->nf > 3 && n->fp[3] >= '5');
    *out = n->neg ? -v : v;
    return ST_OK;
}

/* ---- generic values ----------------------------------------------------------------------- */

static int skip_value(Scan *s, int depth);

static int expect_lit(Scan *s, const char *lit, int n) {
    if (s->end - s->p < n || memcmp(s->p, lit, (size_t)n) != 0) return fail(s, SCAN_SYNTAX);
    s->p += n;
    if (s->p < s->end && !is_ws(*s->p) && *s->p != ',' && *s->p != '}' && *s->p != ']') return fail(s, SCAN_SYNTAX);
    return 1;
}

static int skip_container(Scan *s, int depth, uint8_t close) {
    if (depth > MAX_DEPTH) return fail(s, SCAN_UNSUPPORTED);
    s->p++;
    skip_ws(s);
    if (s->p < s->end && *s->p == close) { s->p++; return 1; }
    while (1) {
        if (close == '}') {
            const uint8_t *raw; int64_t rlen; int esc;
            if (s->p >= s->end || *s->p != '"' || !parse_string(s, NULL, NULL, &raw, &rlen, &esc)) return fail(s, SCAN_SYNTAX);
            skip_ws(s);
            if (s->p >= s->end || *s->p != ':') return fail(s, SCAN_SYNTAX);
            s->p++;
            skip_ws(s);
        }
        if (!skip_value(s, depth + 1)) return 0;
        skip_ws(s);
        if (s->p >= s->end) return fail(s, SCAN_SYNTAX);
        if (*s->p == ',') { s->p++; skip_ws(s); continue; }
        if (*s->p == close) { s->p++; return 1; }
        return fail(s, SCAN_SYNTAX);
    }
}

static int skip_value(Scan *s, int depth) {
    if (s->p >= s->end) return fail(s, SCAN_SYNTAX);
    const uint8_t *raw; int64_t rlen; int esc;
    Num n;
    switch (*s->p) {
        case '"': return parse_string(s, NULL, NULL, &raw, &rlen, &esc);
        case '{': return skip_container(s, depth, '}');
        case '[': return skip_container(s, depth, ']');
        case 't': return expect_lit(s, "true", 4);
        case 'f': return expect_lit(s, "false", 5);
        case 'n': return expect_lit(s, "null", 4);
        default: return parse_number(s, &n);
    }
}

/* ---- fields ------------------------------------------------------------------------------- */

static inline void set_num(Scan *s, int f, int st, int64_t v) {
    s->o->nst[s->row * N_NUM + f] = (uint8_t)st;
    if (st == ST_OK) s->o->num[f * s->o->cap + s->row] = v;
}

/* An integer field (args ints): int -> value; null -> null; anything else -> odd. */
static int field_int(Scan *s, int f) {
    if (*s->p == 'n') { set_num(s, f, ST_NULL, 0); return expect_lit(s, "null", 4); }
    if (*s->p == '-' || (*s->p >= '0' && *s->p <= '9')) {
        Num n; int64_t v = 0;
        if (!parse_number(s, &n)) return 0;
        int st = num_int(&n, &v);
        set_num(s, f, st, v);
        return 1;
    }
    set_num(s, f, ST_ODD, 0);
    return skip_value(s, 1);
}

/* pid / tid: as the exact decoder reads them (the value's text cast to an integer, else null). */
static int field_id(Scan *s, int f) {
    uint8_t c = *s->p;
    if (c == '"') {
        const uint8_t *raw; int64_t rlen; int esc;
        if (!parse_string(s, NULL, NULL, &raw, &rlen, &esc)) return 0;
        int64_t i = 0, neg = 0;
        if (rlen && (raw[0] == '+' || raw[0] == '-')) { neg = raw[0] == '-'; i = 1; }
        if (esc) { set_num(s, f, ST_ODD, 0); return 1; }
        int64_t nd = rlen - i, ok = nd > 0, numeric = 1;
        for (int64_t k = i; ok && k < rlen; k++) ok = raw[k] >= '0' && raw[k] <= '9';
        for (int64_t k = 0; !ok && numeric && k < rlen; k++) numeric = hexval(raw[k]) >= 0 || is_ws(raw[k]) || raw[k] == 'x' || raw[k] == 'X' || raw[k] == '+' || raw[k] == '-';
        if (!ok) { set_num(s, f, numeric && rlen ? ST_ODD : ST_NULL, 0); return 1; } /* "0x1f", " 7": the exact reader's; "Spans": a label, null */
        if (nd > 18) { set_num(s, f, ST_ODD, 0); return 1; }
        int64_t v = digits(raw + i, (int)nd);
        set_num(s, f, ST_OK, neg ? -v : v);
        return 1;
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        Num n; int64_t v = 0;
        if (!parse_number(s, &n)) return 0;
        if (n.has_frac && !n.has_exp) { set_num(s, f, ST_NULL, 0); return 1; } /* "1.5" is no integer: null */
        int st = num_int(&n, &v);
        set_num(s, f, st, v);
        return 1;
    }
    if (c == 'n') { set_num(s, f, ST_NULL, 0); return expect_lit(s, "null", 4); }
    set_num(s, f, ST_ODD, 0);
    return skip_value(s, 1);
}

/* ts / dur: a number in µs -> exact ns; null -> null; anything else -> odd. */
static int field_time(Scan *s, int f) {
    uint8_t c = *s->p;
    if (c == '-' || (c >= '0' && c <= '9')) {
        Num n; int64_t v = 0;
        if (!parse_number(s, &n)) return 0;
        int st = num_us_to_ns(&n, &v);
        set_num(s, f, st, v);
        return 1;
    }
    if (c == 'n') { set_num(s, f, ST_NULL, 0); return expect_lit(s, "null", 4); }
    set_num(s, f, ST_ODD, 0);
    return skip_value(s, 1);
}

/* grid / block: the first three integers of a list (0 <= v < 2^31); null is null; anything else is odd
 * (the exact reader counts it as a wrong type). */
static int field_dim3(Scan *s, int f0) {
    if (*s->p == 'n') return expect_lit(s, "null", 4);
    if (*s->p != '[') { set_num(s, f0, ST_ODD, 0); return skip_value(s, 1); }
    s->p++;
    skip_ws(s);
    int i = 0;
    if (s->p < s->end && *s->p == ']') { s->p++; return 1; }
    while (1) {
        if (s->p >= s->end) return fail(s, SCAN_SYNTAX);
        if (i < 3) {
            if (*s->p == '-' || (*s->p >= '0' && *s->p <= '9')) {
                Num n; int64_t v = 0;
                if (!parse_number(s, &n)) return 0;
                int st = num_int(&n, &v);
                if (st == ST_OK && (v < 0 || v > INT32_MAX)) st = ST_ODD;
                set_num(s, f0 + i, st, v);
            } else {
                set_num(s, f0 + i, ST_ODD, 0);
                if (!skip_value(s, 2)) return 0;
            }
        } else if (!skip_value(s, 2)) {
            return 0;
        }
        i++;
        skip_ws(s);
        if (s->p >= s->end) return fail(s, SCAN_SYNTAX);
        if (*s->p == ',') { s->p++; skip_ws(s); continue; }
        if (*s->p == ']') { s->p++; return 1; }
        return fail(s, SCAN_SYNTAX);
    }
}


/* ---- string columns: dictionary-encoded ---------------------------------------------------- */

static inline uint32_t hash_bytes(const uint8_t *v, int64_t n) {
    uint64_t h = 1469598103934665603ULL ^ (uint64_t)n;
    int64_t k = n < 24 ? n : 24;  /* the first 24 and the last 8 bytes: names differ early or late */
    for (int64_t i = 0; i < k; i++) h = (h ^ v[i]) * 1099511628211ULL;
    for (int64_t i = n - 8 > k ? n - 8 : k; i < n; i++) h = (h ^ v[i]) * 1099511628211ULL;
    return (uint32_t)(h ^ (h >> 29));
}

/* The dictionary code of the string just written at the end of column f's heap (kept there when new). */
static int intern(Scan *s, int f, int64_t n) {
    Out *o = s->o;
    uint8_t *heap = o->heap + f * o->hcap;
    const uint8_t *v = heap + s->hpos[f];
    int32_t *table = o->table + f * o->tsize, *doff = o->doff + f * (o->tsize / 2 + 1);
    uint32_t mask = (uint32_t)o->tsize - 1, i = hash_bytes(v, n) & mask;
    while (table[i] >= 0) {
        int32_t c = table[i];
        if (doff[c + 1] - doff[c] == n && memcmp(heap + doff[c], v, (size_t)n) == 0) return c;
        i = (i + 1) & mask;
    }
    int64_t c = o->ndict[f];
    if (c >= o->tsize / 2) { o->why = 2; return fail(s, SCAN_CAPACITY) - 1; }
    table[i] = (int32_t)c;
    s->hpos[f] += n;
    doff[c + 1] = (int32_t)s->hpos[f];
    o->ndict[f] = c + 1;
    return (int)c;
}

static inline int32_t *code_at(Scan *s, int f) { return s->o->code + f * s->o->cap + s->row; }

/* A string field: unescaped and interned; null -> null; anything else -> odd. */
static int field_str(Scan *s, int f) {
    uint8_t c = *s->p;
    int32_t *code = code_at(s, f);
    if (c == '"') {
        const uint8_t *raw; int64_t rlen, olen = 0; int esc;
        if (*code != CODE_NULL) return fail(s, SCAN_UNSUPPORTED); /* a duplicate key */
        if (!parse_string(s, s->o->heap + f * s->o->hcap + s->hpos[f], &olen, &raw, &rlen, &esc)) return 0;
        int k = intern(s, f, olen);
        if (k < 0) return 0;
        *code = k;
        return 1;
    }
    if (c == 'n') return expect_lit(s, "null", 4);
    *code = CODE_ODD;
    return skip_value(s, 1);
}

/* Input Dims / Input type: recorded when not null, [] or "". */
static int field_shape(Scan *s) {
    const uint8_t *start = s->p;
    if (!skip_value(s, 1)) return 0;
    int64_t n = s->p - start;
    int empty = (n == 4 && memcmp(start, "null", 4) == 0) || (n == 2 && (memcmp(start, "\"\"", 2) == 0));
    if (!empty && start[0] == '[') {
        const uint8_t *q = start + 1;
        while (q < s->p && is_ws(*q)) q++;
        empty = *q == ']';
    }
    if (!empty) s->o->shapes[s->row] = 1;
    return 1;
}

/* What a key of an event or of its args holds, and where it goes. */
enum { T_SKIP, T_INT, T_ID, T_TIME, T_STR, T_DIM3, T_SHAPE, T_ARGS };
typedef struct { uint8_t type, field; } Slot;

/* k[0..n) equals the literal lit (n bytes), word by word. */
static inline int eq(const uint8_t *k, const char *lit, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t a, b;
        memcpy(&a, k + i, 8);
        memcpy(&b, lit + i, 8);
        if (a != b) return 0;
    }
    for (; i < n; i++) if (k[i] != (uint8_t)lit[i]) return 0;
    return 1;
}

#define IS(lit) (eq(k, lit, (int64_t)sizeof(lit) - 1))

static Slot event_slot(const uint8_t *k, int64_t n) {
    Slot none = {T_SKIP, 0};
    if (n == 2) {
        if (IS("ph")) return (Slot){T_STR, S_PH};
        if (IS("ts")) return (Slot){T_TIME, F_TS};
    } else if (n == 3) {
        if (IS("cat")) return (Slot){T_STR, S_CAT};
        if (IS("pid")) return (Slot){T_ID, F_PID};
        if (IS("tid")) return (Slot){T_ID, F_TID};
        if (IS("dur")) return (Slot){T_TIME, F_DUR};
    } else if (n == 4) {
        if (IS("name")) return (Slot){T_STR, S_NAME};
        if (IS("args")) return (Slot){T_ARGS, 0};
    }
    return none;
}

static Slot args_slot(const uint8_t *k, int64_t n) {
    Slot none = {T_SKIP, 0};
    switch (n) {
        case 3: if (IS("Seq")) return (Slot){T_INT, F_SEQ};
            break;
        case 4: if (IS("grid")) return (Slot){T_DIM3, F_GX};
            break;
        case 5:
            if (IS("block")) return (Slot){T_DIM3, F_BX};
            if (IS("bytes")) return (Slot){T_INT, F_BYTES};
            if (IS("dtype")) return (Slot){T_STR, S_DTYPE};
            break;
        case 6:
            if (IS("device")) return (Slot){T_INT, F_DEV};
            if (IS("stream")) return (Slot){T_INT, F_STREAM};
            break;
        case 8: if (IS("graph id")) return (Slot){T_INT, F_GRAPH};
            break;
        case 10:
            if (IS("Group size")) return (Slot){T_INT, F_GSIZE};
            if (IS("Input Dims") || IS("Input type")) return (Slot){T_SHAPE, 0};
            break;
        case 11:
            if (IS("External id")) return (Slot){T_INT, F_EXT};
            if (IS("correlation")) return (Slot){T_INT, F_CORR};
            break;
        case 13:
            if (IS("shared memory")) return (Slot){T_INT, F_SHMEM};
            if (IS("graph node id")) return (Slot){T_INT, F_GNODE};
            if (IS("In msg nelems")) return (Slot){T_INT, F_INN};
            break;
        case 14: if (IS("Out msg nelems")) return (Slot){T_INT, F_OUTN};
            break;
        case 15: if (IS("Collective name")) return (Slot){T_STR, S_COLL};
            break;
        case 18: if (IS("Process Group Name")) return (Slot){T_STR, S_PGN};
            break;
        case 19: if (IS("Process Group Ranks")) return (Slot){T_STR, S_PGR};
            break;
        case 20: if (IS("registers per thread")) return (Slot){T_INT, F_REGS};
            break;
        case 25: if (IS("Process Group Description")) return (Slot){T_STR, S_PGD};
            break;
        default: break;
    }
    return none;
}

static int members(Scan *s, int is_args);

static int member_value(Scan *s, Slot slot) {
    switch (slot.type) {
        case T_INT: return field_int(s, slot.field);
        case T_ID: return field_id(s, slot.field);
        case T_TIME: return field_time(s, slot.field);
        case T_STR: return field_str(s, slot.field);
        case T_DIM3: return field_dim3(s, slot.field);
        case T_SHAPE: return field_shape(s);
        case T_ARGS:
            if (*s->p == '{') return members(s, 1);
            if (*s->p != 'n') s->o->shapes[s->row] = 1; /* args that are no object: the exact reader counts them */
            return skip_value(s, 1);
        default: return skip_value(s, 2);
    }
}

/* An object's members (the event's, or its args'), each value read into the column its key names. */
static int members(Scan *s, int is_args) {
    s->p++;
    skip_ws(s);
    if (s->p < s->end && *s->p == '}') { s->p++; return 1; }
    while (1) {
        const uint8_t *raw; int64_t rlen; int esc;
        if (s->p >= s->end || *s->p != '"') return fail(s, SCAN_SYNTAX);
        if (!parse_string(s, NULL, NULL, &raw, &rlen, &esc)) return 0;
        if (esc) return fail(s, SCAN_UNSUPPORTED); /* a key spelled with escapes: the exact decoder matches it */
        skip_ws(s);
        if (s->p >= s->end || *s->p != ':') return fail(s, SCAN_SYNTAX);
        s->p++;
        skip_ws(s);
        if (s->p >= s->end) return fail(s, SCAN_SYNTAX);
        if (!member_value(s, is_args ? args_slot(raw, rlen) : event_slot(raw, rlen))) return 0;
        skip_ws(s);
        if (s->p >= s->end) return fail(s, SCAN_SYNTAX);
        if (*s->p == ',') { s->p++; skip_ws(s); continue; }
        if (*s->p == '}') { s->p++; return 1; }
        return fail(s, SCAN_SYNTAX);
    }
}

/* ---- classification ----------------------------------------------------------------------- */

/* Code of dictionary entry k of column f in a packed table (len byte, bytes, code byte; len 0 ends), else dflt. */
static int lookup(const Scan *s, int f, int32_t k, const uint8_t *table, int dflt) {
    const Out *o = s->o;
    const int32_t *doff = o->doff + f * (o->tsize / 2 + 1);
    const uint8_t *v = o->heap + f * o->hcap + doff[k];
    int64_t n = doff[k + 1] - doff[k];
    for (const uint8_t *t = table; *t; t += *t + 2) {
        if (*t == n && memcmp(t + 1, v, (size_t)n) == 0) return (int8_t)t[*t + 1];
    }
    return dflt;
}

/* Cached by dictionary code: -100 not listed, else the table's code. */
static int classed(Scan *s, int f, int32_t k, int8_t *cache, const uint8_t *table) {
    if (k >= N_CLASS) return lookup(s, f, k, table, -100);
    if (cache[k] == -128) cache[k] = (int8_t)lookup(s, f, k, table, -100);
    return cache[k];
}

static int classify(Scan *s) {
    int32_t ph = *code_at(s, S_PH), cat = *code_at(s, S_CAT);
    if (ph == CODE_ODD || cat == CODE_ODD) return fail(s, SCAN_UNSUPPORTED);
    if (ph == CODE_NULL) return KIND_UNKNOWN_PH;
    const Out *o = s->o;
    const int32_t *doff = o->doff + S_PH * (o->tsize / 2 + 1);
    const uint8_t *v = o->heap + S_PH * o->hcap + doff[ph];
    int64_t n = doff[ph + 1] - doff[ph];
    int catc = cat >= 0 ? classed(s, S_CAT, cat, s->catcls, s->cats) : -100; /* -100: not listed, -1: skipped */
    if (n == 1 && v[0] == 'X') {
        if (catc >= 0) return catc;
        return catc == -1 ? KIND_DROP : KIND_UNKNOWN_CAT;
    }
    if (n == 1 && (v[0] == 'i' || v[0] == 'I')) {
        if (catc == -1 || o->nst[s->row * N_NUM + F_TS] == ST_NULL) return KIND_DROP;
        return s->instant_kind;
    }
    return classed(s, S_PH, ph, s->phcls, s->phases) == 1 ? KIND_DROP : KIND_UNKNOWN_PH;
}

/* A kept row holds a value only the exact decoder models. */
static int row_is_odd(Scan *s) {
    if (s->o->shapes[s->row]) return 1;
    const uint8_t *st = s->o->nst + s->row * N_NUM;
    for (int f = 0; f < N_NUM; f++) if (st[f] == ST_ODD) return 1;
    for (int f = 0; f < N_STR; f++) if (*code_at(s, f) == CODE_ODD) return 1;
    return 0;
}

static int event(Scan *s) {
    Out *o = s->o;
    if (s->row >= o->cap) { o->why = 1; return fail(s, SCAN_CAPACITY); }
    memset(o->nst + s->row * N_NUM, ST_NULL, N_NUM);
    for (int f = 0; f < N_STR; f++) *code_at(s, f) = CODE_NULL;
    o->shapes[s->row] = 0;
    if (s->p >= s->end || *s->p != '{') return fail(s, SCAN_UNSUPPORTED); /* an array element that is no object */
    if (!members(s, 0)) return 0;
    int k = classify(s);
    if (s->err) return 0;
    int32_t nc = *code_at(s, S_NAME);
    if (nc >= 0 && s->module_len > 0) { /* a module range: the caller's other reader keeps it */
        const int32_t *doff = o->doff + S_NAME * (o->tsize / 2 + 1);
        if (doff[nc + 1] - doff[nc] >= s->module_len
            && memcmp(o->heap + S_NAME * o->hcap + doff[nc], s->module, (size_t)s->module_len) == 0)
            return fail(s, SCAN_MODULE);
    }
    if (k == KIND_DROP) return 1;
    if (k >= 0 && row_is_odd(s)) return fail(s, SCAN_UNSUPPORTED);
    if (k >= 0 && *code_at(s, S_NAME) == CODE_NULL) { /* a kept row without a name is named "" (the exact decoder's fill) */
        int c = intern(s, S_NAME, 0);
        if (c < 0) return 0;
        *code_at(s, S_NAME) = c;
    }
    o->kind[s->row] = (int8_t)k;
    s->row++;
    return 1;
}

/* Scan the events of ``buf`` (``bare``: no enclosing brackets); o->rows = the rows. Returns 0, or
 * SCAN_SYNTAX / SCAN_CAPACITY (o->why says what filled up) / SCAN_UNSUPPORTED; o->stop = where it
 * stopped. ``cats``: packed (len, bytes, code) entries, code >= 0 the kind of an X event of that
 * category, -1 a skipped category; ``phases``: the known phases (code 1); ``module``: the name prefix
 * of a module range (``module_len`` bytes; 0: none), see SCAN_MODULE. */
int64_t tk_scan_events(const uint8_t *buf, int64_t len, int32_t bare, Out *o, const uint8_t *cats,
                       const uint8_t *phases, int32_t instant_kind, const uint8_t *module, int64_t module_len) {
    Scan s;
    memset(&s, 0, sizeof s);
    memset(s.catcls, -128, sizeof s.catcls);
    memset(s.phcls, -128, sizeof s.phcls);
    s.p = buf; s.end = buf + len; s.o = o;
    s.cats = cats; s.phases = phases; s.instant_kind = instant_kind;
    s.module = module; s.module_len = module_len;
    memset(o->table, 0xFF, (size_t)(N_STR * o->tsize) * sizeof(int32_t));
    for (int f = 0; f < N_STR; f++) { o->ndict[f] = 0; o->doff[f * (o->tsize / 2 + 1)] = 0; }
    o->rows = 0; o->why = 0;
    skip_ws(&s);
    if (!bare) {
        if (s.p >= s.end || *s.p != '[') { o->stop = s.p - buf; return SCAN_SYNTAX; }
        s.p++;
        skip_ws(&s);
    }
    int empty = bare ? s.p >= s.end : (s.p < s.end && *s.p == ']');
    if (empty && !bare) s.p++;
    while (!empty) {
        if (!event(&s)) break;
        skip_ws(&s);
        if (s.p < s.end && *s.p == ',') { s.p++; skip_ws(&s); continue; }
        if (!bare && s.p < s.end && *s.p == ']') s.p++;
        else if (!bare || s.p < s.end) fail(&s, SCAN_SYNTAX);
        break;
    }
    if (!s.err) {
        skip_ws(&s);
        if (s.p != s.end) fail(&s, SCAN_SYNTAX);
    }
    o->stop = s.p - buf;
    o->rows = s.row;
    return s.err;
}
