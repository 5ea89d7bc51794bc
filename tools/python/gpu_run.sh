#!/usr/bin/env bash
# The GPU-box job: fixtures, chat references, tokenizer references, and the
# default model. Run from the repository root on the device machine with
# OUT set to a folder that comes back (the device tool's $OUT):
#   bash tools/python/gpu_run.sh [fixtures] [chat] [tok] [train] [parity] [MINUTES]
# With no stage names every stage runs. Everything is logged to $OUT/run.log;
# results come back as $OUT/{fixtures,misc,model}.tgz.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/run.log") 2>&1
set -x
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=true
stages="${*:-fixtures chat tok train}"
minutes=3
for s in $stages; do case $s in [0-9]*) minutes=$s;; esac; done
has() { case " $stages " in *" $1 "*) return 0;; esac; return 1; }

nvidia-smi -L || true
python3 -c 'import torch, transformers, tokenizers, jinja2; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), "transformers", transformers.__version__, "tokenizers", tokenizers.__version__, "jinja2", jinja2.__version__); print([n for n in dir(transformers) if n.startswith("Qwen3_5")])'

if has fixtures; then
  timeout 240 python3 tools/python/make_fixtures.py --out tests/fixtures
  echo "make_fixtures rc=$?"
  tar czf "$OUT/fixtures.tgz" $(ls -d tests/fixtures/qwen3_5 tests/fixtures/qwen3_5_moe tests/fixtures/qwen2 tests/fixtures/mistral 2>/dev/null)
fi
if has chat; then
  timeout 60 python3 tools/python/make_chat_refs.py --check-transformers
  echo "make_chat_refs rc=$?"
fi
if has tok && [ -f tools/python/make_tok_refs.py ]; then
  timeout 60 python3 tools/python/make_tok_refs.py
  echo "make_tok_refs rc=$?"
fi
if has chat || has tok; then
  tar czf "$OUT/misc.tgz" tests/fixtures/chat $(ls tests/fixtures/tokenizer/*.json 2>/dev/null)
fi
if has train; then
  if timeout 150 python3 tools/python/train_default.py --smoke; then
    timeout $(( ${minutes%.*} * 60 + 200 )) python3 tools/python/train_default.py --minutes "$minutes"
    echo "train rc=$?"
    tar czf "$OUT/model.tgz" models/default tests/parity-smoke.json
  else
    echo "train smoke FAILED: full training skipped"
  fi
fi
if has parity; then
  # re-check the committed models/default and rewrite tests/parity-smoke.json
  timeout 200 python3 tools/python/train_default.py --parity-only
  echo "parity rc=$?"
  tar czf "$OUT/model.tgz" models/default tests/parity-smoke.json
fi
ls -la "$OUT"
