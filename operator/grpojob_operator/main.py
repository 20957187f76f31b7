"""`grpojob operator`: run the kopf operator in this process."""
from __future__ import annotations

import argparse
import logging

import kopf

from .config import OperatorConfig
from .controller import Controller
from .handlers import register

log = logging.getLogger("grpojob.operator")


def build(cfg: OperatorConfig) -> tuple[kopf.OperatorRegistry, Controller]:
    registry = kopf.OperatorRegistry()
    ctl = Controller(cfg)
    register(registry, ctl)
    return registry, ctl


def main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # kopf logs every successful handler and timer tick at INFO: a line per job every few seconds.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    cfg = OperatorConfig.from_env(metrics_port=args.metrics_port, metrics_host=args.metrics_host)
    registry, _ = build(cfg)
    namespaces = list(args.namespace or [])
    log.info("watching %s", ", ".join(namespaces) if namespaces else "all namespaces")
    kopf.run(registry=registry, clusterwide=not namespaces, namespaces=namespaces,
             liveness_endpoint=args.liveness or None,
             standalone=args.peering is None, peering_name=args.peering)
    return 0
