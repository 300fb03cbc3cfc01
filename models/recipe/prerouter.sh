#!/usr/bin/env bash
# Trains the prerouter heads shipped as models/moestream-tiny-moe/prerouter.safetensors.
#
# Needs work/train_docs.json from `train.py --stage data` and a release build of moestream.
# The text is the first 83 training documents (~1.0 MB, never the validation split); collection
# teacher-forces 240k tokens of it through the bundled model (~9 min on lavapipe, 2 cores) and
# training takes ~2 min on 2 cores. The heads read token t's FFN inputs and routing and token
# t+1's input embedding (`token`: they run once the next token is chosen), 64 wide.
# Outputs: the heads file, with its per-layer recall in the file's metadata, and
# work/prerouter_report.json (the same report).
set -euo pipefail
cd "$(dirname "$0")/../.."
WORK=models/recipe/work
MODEL=models/moestream-tiny-moe
BIN=${MOESTREAM:-target/release/moestream}
python3 - "$WORK" <<'PY'
import json, sys
work = sys.argv[1]
docs = json.load(open(f"{work}/train_docs.json"))
out, size = [], 0
for d in docs:
    out.append(d)
    size += len(d)
    if size > 1_000_000:
        break
open(f"{work}/prerouter_train.txt", "w").write("\n\n".join(out))
print(f"{len(out)} documents, {size} characters")
PY
rm -rf "$WORK/prerouter_data"
"$BIN" prerouter collect --model "$MODEL" --file "$WORK/prerouter_train.txt" --out "$WORK/prerouter_data" --max-tokens 240000
"$BIN" prerouter train --data "$WORK/prerouter_data" --model "$MODEL" --out "$MODEL/prerouter.safetensors" \
    --features next,prev,deep,token --hidden 64 --epochs 4 --seed 0 --json > "$WORK/prerouter_report.json"
python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print('mean recall@k', r['mean_recall'])" "$WORK/prerouter_report.json"
