#!/usr/bin/env bash
# The KV-plan measurements of bench/RESULTS.md on Qwen2.5-Coder-1.5B (issue #16):
# a .zack calibrated on licence text and Python sources, then held-out accuracy
# of plans at several byte targets on three tasks the calibration never saw:
#   ppl      Node.js `url` + `child_process` docs (prose with code), 4K context, KL
#            against saved baseline logits
#   passkey  a number hidden at depths 0.25/0.5/0.75 of 4K-16K tokens of filler
#   code     the 62 function-completion problems of tests/data/code, run in the sandbox
# and the smallest plan keeping >= 99% of the baseline (eval --target, plans at
# each eviction level searched jointly). Every file lands in $OUT (default
# /tmp/kv_plans); the corpora come from files every Debian machine with python3
# and nodejs' docs has. Hours on a 2-core machine: run the parts you need.
#
#   bash bench/kv_plans.sh calibrate   # the .zack (about 10 min)
#   bash bench/kv_plans.sh ppl         # baseline logits, then each target
#   bash bench/kv_plans.sh target      # eval --target 0.99 over plan and plan+evict
#   bash bench/kv_plans.sh passkey
#   bash bench/kv_plans.sh code
#   bash bench/kv_plans.sh tails       # codes below 2 bits, simulated (a patched copy; needs ppl's files)
#   bash bench/kv_plans.sh decompose   # one plan's KL with its keys, values, early or late layers exact
#   bash bench/kv_plans.sh layers      # one plan's KL with each layer exact in turn (29 runs)
#   bash bench/kv_plans.sh long        # KL at ${CTX:-16384} tokens on held-out Python, scored a token a step
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
zack="${ZACK:-$here/build/zack}"
model="${MODEL:-$here/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf}"
out="${OUT:-/tmp/kv_plans}"
targets="${TARGETS:-0.1 0.15 0.2 0.25 0.3}"
threads="${THREADS:-2}"
mkdir -p "$out"
z="$out/q15.zack"

corpora() {
    cat /usr/share/common-licenses/GPL-3 /usr/share/common-licenses/Apache-2.0 > "$out/calib_lic.txt"
    cat /usr/lib/python3.11/shlex.py /usr/lib/python3.11/fractions.py /usr/lib/python3.11/heapq.py > "$out/calib_py.txt"
    cat /usr/share/doc/nodejs/api/url.md /usr/share/doc/nodejs/api/child_process.md > "$out/heldout_node.md"
}

# Python both plan-editing modes start with: plan(zack, spec) loads a plan file (spec ends in .json)
# or the .zack's recorded plan nearest a target; exact(q, h, keys, values) makes head h's keys and/or
# values 16-bit at full rank (no tail, 0-bit or 2-bit channels).
plan_py='
import json, sys
def plan(zack, spec):
    if spec.endswith(".json"):
        return json.load(open(spec))
    import gguf
    f = gguf.GGUFReader(zack).fields["zack.plans"]
    plans = [json.loads(bytes(f.parts[i]).decode()) for i in f.data]
    return min(plans, key=lambda q: abs(q["target"] - float(spec)))
def exact(q, h, keys=True, values=True):
    q["bits"] = 16
    d = q["model"]["head_dim"]
    if keys:
        q["bits_k"][h] = 16
        for t in ("tails_k", "zeros_k", "mids_k"):
            if q.get(t): q[t][h] = 0
        if q.get("ranks_k"): q["ranks_k"][h] = d
    if values:
        q["bits_v"][h] = 16
        if q.get("ranks_v"): q["ranks_v"][h] = d
'

case "${1:-}" in
    calibrate)
        corpora
        "$zack" calibrate -m "$model" --corpus "$out/calib_lic.txt" --corpus "$out/calib_py.txt" --tokens 8192 \
            --sens-tokens 4096 --ctx 1024 -t "$threads" -o "$z" --kv-target ${targets// /,}
        ;;
    ppl)
        [ -f "$out/base4k.bin" ] || "$zack" eval -m "$z" --task ppl -f "$out/heldout_node.md" -c 4096 --limit 2 \
            -t "$threads" --kl-divergence-base "$out/base4k.bin"
        for cfg in "--kv-bits 4" "--kv-bits 2" $(for t in $targets; do echo "--kv-plan=$t"; done); do
            "$zack" eval -m "$z" --task ppl --kl-divergence-base "$out/base4k.bin" --kl-divergence -t "$threads" \
                ${cfg/=/ } --json "$out/ppl_$(echo "$cfg" | tr -c 'a-z0-9.' _).json"
        done
        ;;
    target)
        "$zack" eval -m "$z" --task ppl --kl-divergence-base "$out/base4k.bin" --kl-divergence -t "$threads" \
            --target 0.99 --methods plan plan+evict --steps 5 --json "$out/target.json" --plot "$out/target.svg" \
            --plan-out "$out/best_ppl.json"
        ;;
    passkey)
        for len in 4096 8192 16384; do
            "$zack" eval -m "$z" --task passkey --passkey-lengths "$len" --passkey-depths 0.25,0.5,0.75 \
                -c $((len + 256)) -t "$threads" --sweep --methods plan --points 4 --plan-min 0.1 \
                --json "$out/passkey_$len.json"
        done
        ;;
    code)
        for cfg in "" "--kv-bits 4" $(for t in $targets; do echo "--kv-plan=$t"; done); do
            "$zack" eval -m "$z" --task code --data "$here/tests/data/code/problems.jsonl" -t "$threads" ${cfg/=/ } \
                --json "$out/code_$(echo "base$cfg" | tr -c 'a-z0-9.' _).json"
        done
        ;;
    tails)
        # 1-bit tails of the 2-bit sides, simulated by bench/experiments/one_bit_tails.patch in a
        # throwaway copy of HEAD (the product never reads ZK_SIM_*). The .zack and plans: $z, $PLANS.
        src="$out/tails-src"
        [ -d "$src" ] || git -C "$here" worktree add --detach "$src" HEAD
        git -C "$src" apply --check "$here/bench/experiments/one_bit_tails.patch" 2>/dev/null &&
            git -C "$src" apply "$here/bench/experiments/one_bit_tails.patch"
        cmake -S "$src" -B "$src/build" -DCMAKE_BUILD_TYPE=Release > /dev/null
        cmake --build "$src/build" --target zack -j "$threads" > /dev/null
        # a hand plan next to the calibrated ones: layer 0 at 4 bits, 2 bits elsewhere, every rank full
        python3 "$here/bench/tails_table.py" --hand-plan "$z" "$out/plan_l0q4.json"
        for plan in ${PLANS:-0.16 0.165 "$out/plan_l0q4.json"}; do
            for sim in "" ZK_SIM_K1=96 ZK_SIM_K1=64 ZK_SIM_K1=32 ZK_SIM_KM=96 ZK_SIM_K0=96 ZK_SIM_V1=64 \
                "ZK_SIM_K1=64 ZK_SIM_V1=64"; do
                env $sim "$src/build/zack" eval -m "$z" --task ppl --kl-divergence-base "$out/base4k.bin" \
                    --kl-divergence -t "$threads" --kv-plan "$plan" \
                    --json "$out/tails_$(basename "$plan" .json)_$(echo "$sim" | tr -c 'A-Z0-9' _).json"
            done
        done
        python3 "$here/bench/tails_table.py" "$z" "$out"/tails_*.json
        ;;
    decompose)
        # Where a plan's loss comes from (needs ppl's base4k.bin): the plan at target ${PLAN:-0.1} with one part
        # exact at a time (keys, values, the first half of the layers, the second), then the KL of each
        python3 - "$z" "${PLAN:-0.1}" "$out" <<PY
$plan_py
p = plan(sys.argv[1], sys.argv[2])
nh = len(p["bits_k"])
for name, keys, values, heads in (("keys", True, False, range(nh)), ("values", False, True, range(nh)),
                                  ("early", True, True, range(nh // 2)), ("late", True, True, range(nh // 2, nh))):
    q = json.loads(json.dumps(p))
    for h in heads:
        exact(q, h, keys, values)
    json.dump(q, open(f"{sys.argv[3]}/decompose_{name}_exact.json", "w"))
PY
        for part in none keys values early late; do
            plan="$out/decompose_${part}_exact.json"
            [ "$part" = none ] && plan="${PLAN:-0.1}"
            "$zack" eval -m "$z" --task ppl --kl-divergence-base "$out/base4k.bin" --kl-divergence -t "$threads" \
                --kv-plan "$plan" --json "$out/decompose_${part}.json"
        done
        ;;
    layers)
        # What each layer's compression costs end to end (needs ppl's base4k.bin; BASE=FILE.bin to
        # use another text): the plan at target ${PLAN:-0.1} (or PLAN=FILE.json) with one layer's
        # heads exact (16-bit keys and values, full rank), for every layer; the KL each removes
        # against the plan's own.
        # bench/experiments/plan_layer_gains.cpp turns the table into per-layer loss weights.
        n_layer=$(python3 - "$z" "${PLAN:-0.1}" "$out" <<PY
$plan_py
p = plan(sys.argv[1], sys.argv[2])
L, KV = p["model"]["n_layer"], p["model"]["n_kv"]
json.dump(p, open(f"{sys.argv[3]}/layers_plan.json", "w"))
for l in range(L):
    q = json.loads(json.dumps(p))
    for h in range(l * KV, (l + 1) * KV):
        exact(q, h)
    json.dump(q, open(f"{sys.argv[3]}/layers_L{l}.json", "w"))
print(L)
PY
)
        base="${BASE:-$out/base4k.bin}"
        for part in plan $(seq 0 $((n_layer - 1)) | sed 's/^/L/'); do
            "$zack" eval -m "$z" --task ppl --kl-divergence-base "$base" --kl-divergence -t "$threads" \
                --kv-plan "$out/layers_$part.json" --json "$out/layers_$part.out.json" > /dev/null
        done
        python3 - "$out" "$n_layer" <<'PY'
import json, sys
def kld(name):
    r = json.load(open(f"{sys.argv[1]}/layers_{name}.out.json"))["runs"][0]
    return r["detail"]["vs_baseline"]["kld_mean"]
k0 = kld("plan")
print(f"plan: KLD {k0:.5f}\nlayer  KLD with it exact  removes")
for l in range(int(sys.argv[2])):
    k = kld(f"L{l}")
    print(f"{l:5d}  {k:17.5f}  {k0 - k:7.5f}")
PY
        ;;
    long)
        # Long context (the tier's fixed cost spread over more tokens): Python modules the calibration never
        # saw (textwrap, difflib, ipaddress, enum, dataclasses, pathlib: 89K tokens; a context of N needs 2N),
        # one window of $CTX tokens whose second half is scored a token a step, as decoding meets it.
        # LONG_CFGS: one quoted set of eval flags a line.
        ctx="${CTX:-16384}"
        {
            cat /usr/lib/python3.11/textwrap.py /usr/lib/python3.11/difflib.py
            for f in ipaddress enum dataclasses pathlib; do printf '\n\n'; cat "/usr/lib/python3.11/$f.py"; done
        } > "$out/heldout_long.py"
        base="$out/base_long_$ctx.bin"
        [ -f "$base" ] || "$zack" eval -m "$z" --task ppl -f "$out/heldout_long.py" -c "$ctx" --chunks 1 \
            -t "$threads" --kl-divergence-base "$base"
        while read -r cfg; do
            [ -n "$cfg" ] || continue
            "$zack" eval -m "$z" --task ppl --kl-divergence-base "$base" --kl-divergence --ppl-piece 1 --chunks 1 \
                -t "$threads" $cfg --json "$out/long_${ctx}_$(echo "$cfg" | tr -c 'a-z0-9.' _).json" < /dev/null
        done <<< "${LONG_CFGS:-"--kv-bits 4
--kv-plan 0.1
--kv-plan 0.1 --kv-tier 1920
--kv-plan 0.1 --kv-tier 1920 --kv-select 2048"}"
        ;;
    *) sed -n '2,22p' "$0"; exit 2 ;;
esac
