#!/bin/bash
# bench/int/sass_same.sh OLD.o ... -- NEW.o ...: do two sets of CUDA objects hold the same device
# code? For a refactor that moves kernels between files (or headers) without meaning to change
# them: the union of the functions of OLD.o ... must equal the union over NEW.o ..., function by
# function and per cubin arch, in machine code (SASS), including the scheduling control bits and
# the resource usage (registers, stack, shared, local, constant bank 0).
#
# Per function, the hash covers every instruction's text and its two 64-bit encoding words, with
# the instruction addresses (/*0a30*/ comments) dropped: branch and call targets are relative to
# the function, so identical code prints identical lines wherever the function lies in its file.
# Normalised (the one thing a move may legitimately change): an operand of constant banks 3 and 4
# (c[0x3][off]: the module's literal pool, c[0x4][off]: its __device__ globals' addresses) is
# printed as c[0xN][*] and that instruction's encoding words are left out of the hash; such
# lines are counted ("masked") in the output so a reader can see whether any arose.
#
# Prints one line per function (status, arch, hash of the instructions, name): same; RES, the
# instructions identical but the resource usage not (the fields that differ follow: e.g. the
# static shared size, where ptxas lays a module's shared memory out differently); DIFF; only-old /
# only-new. Then a verdict: "sass_same: SAME" (exit 0), "sass_same: SAME CODE" (every instruction
# identical, some resource usage not: exit 3), "sass_same: DIFFERENT" (exit 1); 2 on a usage or
# tool error. SASS_SAME_DUMP=DIR keeps the normalised listings
# (DIR/old/*, DIR/new/*) for a diff. Needs cuobjdump (CUDA toolkit or the pip package
# nvidia-cuda-cuobjdump: CUOBJDUMP=/path/to/cuobjdump).
set -euo pipefail
CUOBJDUMP=${CUOBJDUMP:-$(command -v cuobjdump || ls "${CUDA_HOME:-/usr/local/cuda}/bin/cuobjdump" 2>/dev/null || true)}
[ -n "$CUOBJDUMP" ] && [ -x "$CUOBJDUMP" ] || { echo "sass_same: no cuobjdump (set CUOBJDUMP=)" >&2; exit 2; }
old=() new=() side=old
for a in "$@"; do
    if [ "$a" = "--" ]; then side=new; continue; fi
    [ -f "$a" ] || { echo "sass_same: $a: no such object" >&2; exit 2; }
    if [ $side = old ]; then old+=("$a"); else new+=("$a"); fi
done
[ ${#old[@]} -gt 0 ] && [ ${#new[@]} -gt 0 ] || { echo "usage: sass_same.sh OLD.o ... -- NEW.o ..." >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for o in "${old[@]}"; do "$CUOBJDUMP" -sass "$o" >>"$tmp/old.sass"; "$CUOBJDUMP" -res-usage "$o" >>"$tmp/old.res"; done
for o in "${new[@]}"; do "$CUOBJDUMP" -sass "$o" >>"$tmp/new.sass"; "$CUOBJDUMP" -res-usage "$o" >>"$tmp/new.res"; done
python3 - "$tmp" "${SASS_SAME_DUMP:-}" <<'EOF'
import hashlib, os, re, sys
tmp, dump = sys.argv[1], sys.argv[2]
ins = re.compile(r'^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;?\s*/\* (0x[0-9a-f]{16}) \*/\s*$')
enc2 = re.compile(r'^\s*/\* (0x[0-9a-f]{16}) \*/\s*$')
cbank = re.compile(r'c\[0x([34])\]\[[^\]]*\]')

def parse(side):
    """{(arch, function): [normalised lines]}, masked-line count per function"""
    funcs, masked, arch, cur, pend = {}, {}, '?', None, None
    for line in open(os.path.join(tmp, side + '.sass')):
        m = re.match(r'^arch = (\S+)', line)
        if m: arch = m.group(1); continue
        m = re.match(r'^\s*Function : (\S+)', line)
        if m:
            cur = (arch, m.group(1))
            if cur in funcs: sys.exit('sass_same: %s %s twice in the %s objects' % (cur[0], cur[1], side))
            funcs[cur], masked[cur] = [], 0
            continue
        if cur is None: continue
        m = ins.match(line)
        if m:
            text = re.sub(r'\s+', ' ', m.group(2))
            norm = cbank.sub(lambda x: 'c[0x%s][*]' % x.group(1), text)
            pend = [norm, m.group(3), norm != text]
            continue
        m = enc2.match(line)
        if m and pend is not None:
            text, w1, msk = pend
            if msk:
                masked[cur] += 1
                funcs[cur].append(text + ' | masked')
            else:
                funcs[cur].append('%s | %s %s' % (text, w1, m.group(1)))
            pend = None
    arch = '?'
    for line in open(os.path.join(tmp, side + '.res')):
        m = re.match(r'^arch = (\S+)', line)
        if m: arch = m.group(1); continue
        m = re.match(r'^ Function (\S+):\s*$', line)
        if m: cur = (arch, m.group(1)); continue
        if line.startswith('  REG:') and cur in funcs:
            funcs[cur].insert(0, 'res ' + line.strip())
    return funcs, masked

old, om = parse('old')
new, nm = parse('new')
if dump:
    for side, f in (('old', old), ('new', new)):
        os.makedirs(os.path.join(dump, side), exist_ok=True)
        for (a, n), ls in f.items():
            open(os.path.join(dump, side, '%s.%s.sass' % (a, n[:200])), 'w').write('\n'.join(ls) + '\n')
h = lambda ls: hashlib.sha256('\n'.join(ls).encode()).hexdigest()[:16]
code = lambda ls: [x for x in ls if not x.startswith('res ')]
resl = lambda ls: ' '.join(x[4:] for x in ls if x.startswith('res '))
bad = {'DIFF': 0, 'RES': 0, 'only-old': 0, 'only-new': 0}
for key in sorted(set(old) | set(new)):
    a, n = key
    extra = ''
    if key not in new: st, hh = 'only-old', h(old[key])
    elif key not in old: st, hh = 'only-new', h(new[key])
    else:
        co, cn = h(code(old[key])), h(code(new[key]))
        if co != cn: st, hh = 'DIFF', co + '->' + cn
        elif resl(old[key]) != resl(new[key]):
            st, hh = 'RES', co
            ro, rn = resl(old[key]).split(), resl(new[key]).split()
            extra = '  (' + ', '.join('%s -> %s' % (x, y.split(':', 1)[1]) for x, y in zip(ro, rn) if x != y) + ')'
        else: st, hh = 'same', co
    if st != 'same': bad[st] += 1
    mk = max(om.get(key, 0), nm.get(key, 0))
    print('%-8s %-7s %s %s%s%s' % (st, a, hh, n, extra, '  (masked %d)' % mk if mk else ''))
ninst = sum(len(code(v)) for v in old.values())
if bad['DIFF'] or bad['only-old'] or bad['only-new']:
    print('sass_same: DIFFERENT (%s; %d old, %d new functions)' % (
        ', '.join('%d %s' % (v, k) for k, v in bad.items() if v), len(old), len(new)))
    sys.exit(1)
if bad['RES']:
    print('sass_same: SAME CODE (%d functions, %d instructions identical; resource usage differs in %d: RES lines)'
          % (len(old), ninst, bad['RES']))
    sys.exit(3)
print('sass_same: SAME (%d functions, %d instructions, resource usage identical)' % (len(old), ninst))
EOF
