# The art set: ART (openpipe-art 0.5.18) training scripts run with one line changed, the backend
# (grpojob.integrations.art, docs/plugins.md#art). ART's base requirements pin no torch or
# transformers (those are its `backend` extra's: torch==2.10, transformers==5.2, unsloth), but pull
# weave and its tree, none of which the client path imports; so it is installed --no-deps beside our
# runtime, plus what `import art` needs (pyproject's `art` extra):
#   polars 2.1.0 (art.model), litellm 1.82.0 (art.utils.trajectory_logging; ART caps it at 1.82.0);
#   openai 2.54.0: ART declares openai>=2.14 with no cap, but its model client fails on openai 3.x at
#   the first request ("unsupported operand type(s) for +: 'float' and 'Timeout'": ART's
#   httpx.Timeout object), so this set takes the last 2.x (our dev extra allows >=1.55.3,<4).
# Measured on the shared 2-core machine under load (2026-12-02): install 1083 s from a fresh venv (pip cache
# warm; the ART part 14-60 s of it, +101 MB; the venv 2.3 GB); quick pass about 30 s; slow pass: the
# learning run 175-310 s and the exact-tokens run 95-145 s (on two workers: about 5 min).
install_art() {
  python3 -m venv .venv-art && . .venv-art/bin/activate || return 1
  quiet "$OUT/art-install.log" pip install torch==2.13.0 || return 1  # pinned and first: the CPU build
  # the art extra: what ART's client imports (pyproject), as a user installs it (docs/plugins.md#art)
  quiet "$OUT/art-install.log" pip install -e '.[runtime,dev,art]' || return 1
  quiet "$OUT/art-install.log" pip install --no-deps 'openpipe-art==0.5.18'
}
TESTS_art=(-m "not vllm" tests/integrations/test_art.py tests/integrations/test_art_train.py)
EXTRA_SETS="$EXTRA_SETS art"
