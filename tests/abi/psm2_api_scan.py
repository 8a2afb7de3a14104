#!/usr/bin/env python3
"""Scan a set of PSM2 API headers and describe their API surface.

Used by //tests/abi at build time, both on Intel's installed headers
(/usr/include/psm2*.h) and on psmd's own (include/psm2*.h). Nothing
produced from Intel's headers is checked in: every output lands in bazel-out.

The headers are plain C declarations, so a small tokenizer/parser suffices:
comments are dropped, `#ifdef __cplusplus` blocks are skipped, object-like
macros are recorded, and top-level declarations are classified into
functions, typedefs, struct/union definitions (with their fields, anonymous
members flattened) and enum definitions (with their constants). Anything the
parser does not understand is an error, so a future header change cannot be
skipped silently.

Outputs (any subset):
  --manifest FILE  sorted "header: kind name" lines: the API's names. Two
                   header sets with equal manifests declare the same things
                   in the same headers.
  --probe FILE     C source (also valid C++) that prints size/alignment/
                   offset/type of every struct, union, field, typedef and
                   enum, and the value and type of every enum constant and
                   macro. Compiled once against each header set; the outputs
                   must match line for line.
  --decls FILE     The scanned headers' macro definitions, typedefs and
                   function prototypes, re-emitted token by token, for
                   redeclaration after including the other header set
                   (identical redeclarations compile, conflicting ones fail).
"""

import argparse
import os
import re
import sys


class ScanError(Exception):
    pass


# --------------------------------------------------------------------------
# Lexing
# --------------------------------------------------------------------------

def strip_comments(text):
    """Replace comments with a single space, keeping string literals."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            if j < 0:
                raise ScanError("unterminated comment")
            out.append(" ")
            i = j + 2
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
            out.append(" ")
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


TOKEN_RE = re.compile(r"""
    (?P<ws>\s+)
  | (?P<ident>[A-Za-z_]\w*)
  | (?P<num>(?:0[xX][0-9a-fA-F]+|\d+)[uUlL]*)
  | (?P<str>"(?:[^"\\]|\\.)*")
  | (?P<punct><<|>>|\.\.\.|->|[{}()\[\];,*=<>&|~!?:.+\-/%^#])
""", re.X)


def tokenize(text):
    toks = []
    pos = 0
    while pos < len(text):
        m = TOKEN_RE.match(text, pos)
        if not m:
            raise ScanError("cannot tokenize near %r" % text[pos:pos + 40])
        if m.lastgroup != "ws":
            toks.append(m.group())
        pos = m.end()
    return toks


def is_ident(tok):
    return re.match(r"[A-Za-z_]\w*$", tok) is not None


# --------------------------------------------------------------------------
# Preprocessor-level scan
# --------------------------------------------------------------------------

def logical_lines(text):
    lines = []
    buf = ""
    for line in text.split("\n"):
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        lines.append(buf + line)
        buf = ""
    if buf:
        lines.append(buf)
    return lines


def scan_file(path):
    """Return (items, code_tokens) for one header."""
    with open(path, encoding="utf-8", errors="replace") as f:
        text = strip_comments(f.read())
    items = []
    code = []
    skip_depth = 0  # >0 while inside #ifdef __cplusplus
    for line in logical_lines(text):
        s = line.strip()
        if not s.startswith("#"):
            if skip_depth == 0:
                code.append(line)
            continue
        d = s[1:].strip()
        word = re.match(r"\w*", d).group()
        rest = d[len(word):].strip()
        if skip_depth:
            if word in ("if", "ifdef", "ifndef"):
                skip_depth += 1
            elif word == "endif":
                skip_depth -= 1
            elif word in ("else", "elif"):
                raise ScanError("%s: #%s inside __cplusplus block" % (path, word))
            continue
        if word == "ifdef" and rest == "__cplusplus":
            skip_depth = 1
        elif word == "ifndef" and is_ident(rest):
            items.append(("cond", "ifndef " + rest))
        elif word == "endif":
            pass
        elif word == "include":
            items.append(("include", rest))
        elif word == "define":
            m = re.match(r"([A-Za-z_]\w*)(\(?)(.*)$", rest)
            if not m:
                raise ScanError("%s: bad #define %r" % (path, rest))
            name, paren, body = m.groups()
            if paren:
                raise ScanError("%s: function-like macro %s not supported"
                                % (path, name))
            # Keep the replacement list's spelling (whitespace runs collapse
            # to one space, which is how the preprocessor compares macros).
            items.append(("macro", name, " ".join(body.split())))
        else:
            raise ScanError("%s: unsupported directive %r" % (path, s))
    if skip_depth:
        raise ScanError("%s: unterminated #ifdef __cplusplus" % path)
    return items, tokenize("\n".join(code))


# --------------------------------------------------------------------------
# Declaration parsing
# --------------------------------------------------------------------------

OPEN = {"(": ")", "[": "]", "{": "}"}


def split_top(tokens, sep):
    """Split tokens on sep at nesting depth 0 (drops empty trailing parts)."""
    parts, cur, depth = [], [], 0
    for t in tokens:
        if t in OPEN:
            depth += 1
        elif t in OPEN.values():
            depth -= 1
            if depth < 0:
                raise ScanError("unbalanced %r" % t)
        if t == sep and depth == 0:
            parts.append(cur)
            cur = []
        else:
            cur.append(t)
    if depth != 0:
        raise ScanError("unbalanced brackets in %s" % " ".join(tokens))
    if cur:
        parts.append(cur)
    return parts


def match_close(tokens, i):
    """Index of the bracket closing tokens[i]."""
    depth = 0
    for j in range(i, len(tokens)):
        if tokens[j] in OPEN:
            depth += 1
        elif tokens[j] in OPEN.values():
            depth -= 1
            if depth == 0:
                return j
    raise ScanError("unclosed %r" % tokens[i])


def strip_attributes(tokens):
    out, i = [], 0
    while i < len(tokens):
        if tokens[i] in ("__attribute__", "__attribute"):
            if i + 1 >= len(tokens) or tokens[i + 1] != "(":
                raise ScanError("bad __attribute__")
            i = match_close(tokens, i + 1) + 1
            continue
        out.append(tokens[i])
        i += 1
    return out


def declarator_name(tokens):
    """Name declared by a declarator token list (type specifiers included)."""
    toks = strip_attributes(tokens)
    # Function pointer: ... ( * NAME ) ( ... )
    for i in range(len(toks) - 2):
        if toks[i] == "(" and toks[i + 1] == "*" and is_ident(toks[i + 2]):
            return toks[i + 2]
    # Otherwise the last identifier outside brackets.
    name, depth = None, 0
    for t in toks:
        if t in OPEN:
            depth += 1
        elif t in OPEN.values():
            depth -= 1
        elif depth == 0 and is_ident(t):
            name = t
    if name is None:
        raise ScanError("no name in declarator %s" % " ".join(tokens))
    return name


def parse_record_body(tokens, spelling, items):
    """Parse the member list of a struct/union; append field items."""
    for member in split_top(tokens, ";"):
        if member[0] in ("struct", "union") and "{" in member:
            ob = member.index("{")
            cb = match_close(member, ob)
            after = [t for t in strip_attributes(member[cb + 1:])]
            if ob != 1 or after:
                raise ScanError("%s: only anonymous nested struct/union "
                                "members are supported" % spelling)
            # Anonymous member: its fields belong to the enclosing record.
            parse_record_body(member[ob + 1:cb], spelling, items)
            continue
        decls = split_top(member, ",")
        for k, d in enumerate(decls):
            items.append(("field", spelling, declarator_name(d)))


def parse_enum_body(tokens, spelling, items):
    for entry in split_top(tokens, ","):
        if not is_ident(entry[0]) or (len(entry) > 1 and entry[1] != "="):
            raise ScanError("%s: bad enumerator %s" % (spelling, " ".join(entry)))
        items.append(("const", spelling, entry[0]))


def parse_definition(decl, items):
    """decl starts with [typedef] struct/union/enum TAG { ... } [names].

    Returns (spelling, tokens after the closing brace)."""
    i = 1 if decl[0] == "typedef" else 0
    kind = decl[i]
    if kind not in ("struct", "union", "enum"):
        raise ScanError("unsupported definition: %s" % " ".join(decl))
    if not is_ident(decl[i + 1]) or decl[i + 2] != "{":
        raise ScanError("untagged %s definitions are not supported: %s"
                        % (kind, " ".join(decl)))
    spelling = "%s %s" % (kind, decl[i + 1])
    ob = i + 2
    cb = match_close(decl, ob)
    items.append(("enum" if kind == "enum" else "record", spelling))
    if kind == "enum":
        parse_enum_body(decl[ob + 1:cb], spelling, items)
    else:
        parse_record_body(decl[ob + 1:cb], spelling, items)
    return spelling, decl[cb + 1:]


def parse_declarations(tokens, items):
    for decl in split_top(tokens, ";"):
        if decl[:2] == ["extern", '"C"']:
            raise ScanError("extern \"C\" outside #ifdef __cplusplus")
        if "{" in decl:
            spelling, rest = parse_definition(decl, items)
            if decl[0] == "typedef":
                for d in split_top(rest, ","):
                    name = declarator_name(d)
                    items.append(("typedef", name,
                                  "typedef %s %s ;" % (spelling, " ".join(d))))
            elif rest:
                raise ScanError("variable definitions are not supported: %s"
                                % " ".join(decl))
        elif decl[0] == "typedef":
            name = declarator_name(decl[1:])
            items.append(("typedef", name, " ".join(decl) + " ;"))
        elif "(" in decl:
            p = decl.index("(")
            if p == 0 or not is_ident(decl[p - 1]):
                raise ScanError("unsupported declaration: %s" % " ".join(decl))
            items.append(("func", decl[p - 1], " ".join(decl) + " ;"))
        else:
            raise ScanError("unsupported declaration: %s" % " ".join(decl))


def scan(headers):
    """Items of all headers, each tagged with its header's basename."""
    result = []
    for path in headers:
        items, code = scan_file(path)
        parse_declarations(code, items)
        base = os.path.basename(path)
        result.extend((base,) + it for it in items)
    return result


# --------------------------------------------------------------------------
# Outputs
# --------------------------------------------------------------------------

def manifest_lines(items):
    lines = []
    for it in items:
        hdr, kind = it[0], it[1]
        if kind in ("field", "const"):
            lines.append("%s: %s %s.%s" % (hdr, kind, it[2], it[3]))
        else:
            lines.append("%s: %s %s" % (hdr, kind, it[2]))
    return sorted(lines)


PROBE_PRELUDE = r"""/* Generated by tests/abi/psm2_api_scan.py: ABI probe for the PSM2 headers.
 * Build with -DPSM2_ABI_PROBE_INTEL (Intel's headers, by absolute path) or
 * -DPSM2_ABI_PROBE_OURS (psmd's headers). Valid C and C++. */
#include <stdint.h>
#include <stdio.h>

#if defined(PSM2_ABI_PROBE_INTEL)
%(intel_includes)s
#elif defined(PSM2_ABI_PROBE_OURS)
%(our_includes)s
#else
#error "define PSM2_ABI_PROBE_INTEL or PSM2_ABI_PROBE_OURS"
#endif

#ifdef __cplusplus
#include <typeinfo>
#define TN(e) typeid(e).name()
#define LANG "c++"
#else
#define TN(e) _Generic((e), \
    _Bool: "bool", char: "char", signed char: "schar", \
    unsigned char: "uchar", short: "short", unsigned short: "ushort", \
    int: "int", unsigned int: "uint", long: "long", \
    unsigned long: "ulong", long long: "llong", \
    unsigned long long: "ullong", void *: "void*", \
    default: "other")
#define LANG "c"
#endif
#define TNT(T) TN(*(T *)0)
#define VAL(e) ((unsigned long long)(uintptr_t)(e))
#define MEMBER(T, m) (((T *)0)->m)

#define REC(T) \
    printf("record %%s size=%%zu align=%%zu\n", #T, sizeof(T), \
           (size_t)__alignof__(T))
#define FIELD(T, m) \
    printf("field %%s.%%s off=%%zu size=%%zu align=%%zu type=%%s\n", #T, #m, \
           (size_t)offsetof(T, m), sizeof(MEMBER(T, m)), \
           (size_t)__alignof__(MEMBER(T, m)), TN(MEMBER(T, m)))
#define TYPEDEF(T) \
    printf("typedef %%s size=%%zu align=%%zu type=%%s\n", #T, sizeof(T), \
           (size_t)__alignof__(T), TNT(T))
#define ENUMT(T) \
    printf("enum %%s size=%%zu align=%%zu type=%%s\n", #T, sizeof(T), \
           (size_t)__alignof__(T), TNT(T))
#define CONST(c) \
    printf("const %%s value=0x%%llx size=%%zu type=%%s\n", #c, VAL(c), \
           sizeof(c), TN(c))
#define MACRO(c) \
    printf("macro %%s value=0x%%llx size=%%zu type=%%s\n", #c, VAL(c), \
           sizeof(c), TN(c))
#ifdef __cplusplus
#define FUNC(f) printf("func %%s type=%%s\n", #f, typeid(&f).name())
#else
#define FUNC(f) printf("func %%s ptrsize=%%zu\n", #f, sizeof(&f))
#endif

int main(void) {
    printf("lang %%s\n", LANG);
"""


def probe_source(items, intel_dir):
    hdrs = []
    for it in items:
        if it[0] not in hdrs:
            hdrs.append(it[0])
    intel_inc = "\n".join('#include "%s/%s"' % (intel_dir, h) for h in hdrs)
    our_inc = "\n".join('#include "include/%s"' % h for h in hdrs)
    out = [PROBE_PRELUDE % {"intel_includes": intel_inc,
                            "our_includes": our_inc}]
    guards = []
    for it in items:
        kind = it[1]
        if kind == "record":
            out.append("    REC(%s);" % it[2])
        elif kind == "field":
            out.append("    FIELD(%s, %s);" % (it[2], it[3]))
        elif kind == "enum":
            out.append("    ENUMT(%s);" % it[2])
        elif kind == "const":
            out.append("    CONST(%s);" % it[3])
        elif kind == "typedef":
            out.append("    TYPEDEF(%s);" % it[2])
        elif kind == "func":
            out.append("    FUNC(%s);" % it[2])
        elif kind == "macro":
            if it[3]:
                out.append("    MACRO(%s);" % it[2])
            else:
                guards.append(it[2])
                out.append('    printf("defined %s\\n");' % it[2])
    out.append("    return 0;\n}")
    for g in guards:
        out.append("#ifndef %s\n#error \"%s is not defined\"\n#endif" % (g, g))
    return "\n".join(out) + "\n"


def decls_source(items):
    out = ["/* Generated by tests/abi/psm2_api_scan.py from the scanned headers:",
           " * their macros, typedefs and prototypes, token by token. Include",
           " * it after another rendition of the same API: it compiles",
           " * (warning-free) only if every redeclaration is identical. */",
           "#ifdef __cplusplus", 'extern "C" {', "#endif"]
    for it in items:
        kind = it[1]
        if kind == "macro":
            out.append(("#define %s %s" % (it[2], it[3])).rstrip())
        elif kind in ("typedef", "func"):
            out.append(it[3])
    out += ["#ifdef __cplusplus", "}", "#endif"]
    return "\n".join(out) + "\n"


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("headers", nargs="+")
    ap.add_argument("--manifest")
    ap.add_argument("--probe", action="append", default=[],
                    help="may be given several times (e.g. .c and .cc)")
    ap.add_argument("--decls")
    ap.add_argument("--intel-dir", default="/usr/include",
                    help="directory the probe includes Intel's headers from")
    ap.add_argument("--min-funcs", type=int, default=0,
                    help="fail unless at least this many functions are found")
    args = ap.parse_args(argv)
    try:
        items = scan(args.headers)
    except (ScanError, OSError) as e:
        sys.stderr.write("psm2_api_scan: %s\n" % e)
        return 1
    nfunc = sum(1 for it in items if it[1] == "func")
    if nfunc < args.min_funcs:
        sys.stderr.write("psm2_api_scan: only %d functions found in %s\n"
                         % (nfunc, " ".join(args.headers)))
        return 1
    if args.manifest:
        with open(args.manifest, "w") as f:
            f.write("\n".join(manifest_lines(items)) + "\n")
    for p in args.probe:
        with open(p, "w") as f:
            f.write(probe_source(items, args.intel_dir))
    if args.decls:
        with open(args.decls, "w") as f:
            f.write(decls_source(items))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
