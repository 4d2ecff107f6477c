#!/usr/bin/env bash
# Every error and warning text the code can print is in docs/troubleshooting.md.
#
# What it checks: in every C file (*.c, *.h) under src/ and python/, each call
# that prints or stores a message for the user:
#     kvli_err  kvli_fail_simple  kvli_hint  kvli_r_bad  kvli_describe_miss
#     kvl_bk_error_set  kvl_bk_error_hint  kvli_warn
#     kvli_log / kvli_vlog / ctx->log(...)   at level KVL_LOG_WARN or KVL_LOG_ERROR
#                                            (or a level that is not a constant)
#     fprintf(stderr, ...)  perror(...)  kvl_cli_print_error(...)
#     shm helpers that build such messages: kvli_shm_bad_meta kvli_shm_key_bad
#         kvli_shm_peer_mark_dead kvli_shm_conn_proto_error (add a new helper
#         to MSG_CALLS below when its literal arguments are printed)
#     kvl_check(name, status, hint, fmt, ...)  kvlane doctor's findings, unless
#                                            status is the constant KVL_OKAY
#     PyErr_Format / PyErr_SetString          (python/ only, the C module)
# Each string-literal argument of such a call (adjacent literals joined, each
# branch of a ?: separately, PRIu64-style macros counted as format specifiers)
# is cut at its format specifiers; the longest literal run that is left, with
# whitespace collapsed, must appear verbatim in docs/troubleshooting.md (also
# whitespace-collapsed). Runs shorter than 12 characters are not checked.
#
# How to satisfy it when it fails: add an entry for the message to your
# component's section of docs/troubleshooting.md, writing the message as it is
# printed with each format specifier replaced by <...> (e.g. `no backend named
# '<name>'`), plus its status code, cause and fix. Keep the message on one line
# or wrap it only at spaces; write it in a `code span` or a code block, not in
# a table cell if it contains '|'. Markdown escapes (\|, \*) break the match.
# A message built at run time from a variable (no literal in the call) is not
# checked: document it anyway.
#
# Usage: KVL_SRC=<source dir> bash test_docs_errors.sh [folder...]
#   folders default to src and python; the summary counts missing texts per
#   folder (src/core, src/backends/shm, src/cli, ...). Exit 0 all found, 1 some
#   missing, 77 when python3 is not available.
set -euo pipefail
src=${KVL_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}
doc="$src/docs/troubleshooting.md"
[ -f "$doc" ] || { echo "no $doc"; exit 1; }
command -v python3 >/dev/null || { echo "SKIP: python3 not found"; exit 77; }
if [ $# -eq 0 ]; then set -- src python; fi

exec python3 - "$src" "$doc" "$@" <<'PY'
import os, re, sys
from collections import OrderedDict

root, doc_path, folders = sys.argv[1], sys.argv[2], sys.argv[3:]
MIN = 12
ws = lambda s: re.sub(r'\s+', ' ', s).strip()
doc = ws(open(doc_path, encoding='utf-8').read())

# Calls whose literal arguments are messages.  For the log calls, the index
# of the level argument (0-based), so INFO/DEBUG/TRACE calls can be skipped.
MSG_CALLS = {'kvli_err', 'kvli_fail_simple', 'kvli_hint', 'kvli_r_bad',
             'kvli_describe_miss', 'kvl_bk_error_set', 'kvl_bk_error_hint',
             'kvli_warn', 'perror', 'kvl_cli_print_error',
             # wrappers whose literal arguments end up in a printed message
             'kvli_shm_bad_meta', 'kvli_shm_key_bad', 'kvli_shm_peer_mark_dead',
             'kvli_shm_conn_proto_error',
             # ucx staging: initiator errors, target refusals sent to the peer
             'kvli_ucx_stage_err', 'kvli_ucx_job_refuse'}
LOG_CALLS = {'kvli_log': 0, 'kvli_vlog': 0, '->log': 1, 'kvl_check': 1}
PY_CALLS = {'PyErr_Format', 'PyErr_SetString'}
QUIET = re.compile(r'^(KVL_LOG_(INFO|DEBUG|TRACE|OFF)|KVL_OKAY)$')
call_re = re.compile(r'(->\s*log|\b[A-Za-z_]\w*)\s*\(')

def strip_comments(t):
    """Blank out comments (keeping newlines), leave strings and chars alone."""
    out, i, n = [], 0, len(t)
    while i < n:
        c = t[i]
        if c in '"\'':
            j = i + 1
            while j < n and t[j] != c:
                j += 2 if t[j] == '\\' else 1
            out.append(t[i:j + 1]); i = j + 1
        elif t.startswith('//', i):
            j = t.find('\n', i); j = n if j < 0 else j
            out.append(' ' * (j - i)); i = j
        elif t.startswith('/*', i):
            j = t.find('*/', i + 2); j = n if j < 0 else j + 2
            out.append(re.sub(r'[^\n]', ' ', t[i:j])); i = j
        else:
            out.append(c); i += 1
    return ''.join(out)

def tokens(s):
    """C tokens of an argument list: ('str', text) ('id', x) ('p', punct)."""
    i, n = 0, len(s)
    while i < n:
        c = s[i]
        if c.isspace():
            i += 1
        elif c == '"':
            j = i + 1
            while s[j] != '"':
                j += 2 if s[j] == '\\' else 1
            yield ('str', s[i + 1:j]); i = j + 1
        elif c == "'":
            j = i + 1
            while s[j] != "'":
                j += 2 if s[j] == '\\' else 1
            yield ('p', s[i:j + 1]); i = j + 1
        elif c.isalnum() or c == '_':
            j = i
            while j < n and (s[j].isalnum() or s[j] == '_'):
                j += 1
            yield ('id', s[i:j]); i = j
        else:
            yield ('p', c); i += 1

def split_args(s, start):
    """Arguments of the call whose '(' is at s[start-1]; each a token list."""
    args, cur, depth = [], [], 0
    toks = tokens(s[start:])
    for kind, v in toks:
        if kind == 'p' and v in '([{':
            depth += 1
        elif kind == 'p' and v in ')]}':
            if depth == 0:
                args.append(cur)
                return args
            depth -= 1
        elif kind == 'p' and v == ',' and depth == 0:
            args.append(cur); cur = []
            continue
        cur.append((kind, v))
    return None

def unescape(lit):
    return re.sub(r'\\(x[0-9a-fA-F]+|[0-7]{1,3}|.)',
                  lambda m: {'n': '\n', 't': '\t', 'r': '\r'}.get(m.group(1), m.group(1)
                  if len(m.group(1)) == 1 else ' '), lit)

SPEC = re.compile(r'%(?:%|[-+ #0\']*(?:\*|\d+)?(?:\.(?:\*|\d+))?'
                  r'(?:hh|h|ll|l|j|z|t|L|q)?[diouxXeEfFgGaAcspnmRSUAV]'  # RSUAV: PyErr_Format
                  # "%016" PRIx64: a specifier finished by a macro after the literal
                  r'|[-+ #0\']*(?:\d+)?(?:\.\d+)?(?:hh|h|ll|l|j|z|t|L|q)?$)')
BREAK = '\x00'

def messages(arg):
    """Messages of one argument: runs of adjacent literals (with PRI macros as
    breaks); a ?: makes each branch its own message."""
    out, cur = [], None
    for kind, v in arg:
        if kind == 'str':
            cur = (cur or '') + v
        elif kind == 'id' and re.match(r'^(PRI|SCN)[a-zA-Z0-9]+$', v) and cur is not None:
            cur += BREAK
        else:
            if cur is not None:
                out.append(cur)
            cur = None
    if cur is not None:
        out.append(cur)
    return out

def longest_run(msg):
    parts = []
    for piece in msg.split(BREAK):
        parts += SPEC.split(unescape(piece).replace('%%', '\x01'))
    runs = [ws(p.replace('\x01', '%')) for p in parts]
    return max(runs, key=len) if runs else ''

def level_quiet(arg):
    ids = [v for k, v in arg if k == 'id']
    return len(ids) == 1 and QUIET.match(ids[0]) is not None

missing, checked, per = [], 0, OrderedDict()
files = []
for f in folders:
    for dp, dn, fn in os.walk(os.path.join(root, f)):
        dn.sort()
        files += [os.path.join(dp, x) for x in sorted(fn) if x.endswith(('.c', '.h'))]
for path in files:
    rel = os.path.relpath(path, root)
    folder = os.path.dirname(rel)
    per.setdefault(folder, [0, 0])
    text = strip_comments(open(path, encoding='utf-8', errors='replace').read())
    is_py = rel.split(os.sep)[0] == 'python'
    for m in call_re.finditer(text):
        name = re.sub(r'\s', '', m.group(1))
        if not (name in MSG_CALLS or name in LOG_CALLS or name == 'fprintf'
                or (is_py and name in PY_CALLS)):
            continue
        # a declaration or definition, not a call: "void kvli_err(kvl_error_t *err, ..."
        before = text[text.rfind('\n', 0, m.start()) + 1:m.start()]
        if re.search(r'\b(void|bool|int|kvl_status_t|static|inline|define)\b[\s*]*$', before):
            continue
        args = split_args(text, m.end())
        if not args:
            continue
        if name in LOG_CALLS:
            li = LOG_CALLS[name]
            if len(args) <= li or level_quiet(args[li]):
                continue
        if name == 'fprintf':
            if [v for k, v in args[0] if k != 'p'] != ['stderr']:
                continue
            args = args[1:]
            name = 'fprintf(stderr)'
        line = text.count('\n', 0, m.start()) + 1
        for arg in args:
            for msg in messages(arg):
                run = longest_run(msg)
                if len(run) < MIN:
                    continue
                checked += 1
                per[folder][0] += 1
                if run not in doc:
                    per[folder][1] += 1
                    missing.append('%s:%d: %s: "%s"' % (rel, line, name, run))

for m in missing:
    print('MISSING ' + m)
print('per folder (checked / missing):')
for f, (c, n) in per.items():
    if c == 0:
        continue
    print('  %-22s %4d / %d' % (f, c, n))
print('%d message texts checked, %d missing from docs/troubleshooting.md' % (checked, len(missing)))
sys.exit(1 if missing else 0)
PY
