"""A rendered pod's container run on this machine the way a kubelet and runc would run it, acted
out with Linux mount namespaces (no container runtime or cluster is available here):

- the image's root filesystem is this machine's root seen through an overlay (so nothing written
  to it reaches the host), remounted read-only when the container says readOnlyRootFilesystem;
- each volume mount of the container is the pod's volume: an emptyDir is a fresh directory, a
  configMap the ConfigMap's files (read-only), a secret the Secret's files given by the test
  (read-only, owned by root and the pod's fsGroup, with the volume's defaultMode, as the kubelet
  makes them), a persistentVolumeClaim a directory given by the test;
- the process runs as the securityContext's uid/gid, with every capability dropped when it drops
  ALL, and no_new_privs when allowPrivilegeEscalation is false;
- its environment is the container's envFrom Secrets and env, the downward API resolved, the
  addresses of other pods given by the test (they share this machine's network), and the image's PATH.

It needs root (mount namespaces, overlayfs); `available()` says whether this machine allows it.
"""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Mapping, Optional

# The image's PATH: this interpreter's environment stands for the runtime image's Python.
IMAGE_PATH = f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin"
REPO = Path(__file__).resolve().parents[2]


def available() -> tuple[bool, str]:
    if os.geteuid() != 0:
        return False, "needs root for mount namespaces"
    for tool in ("unshare", "setpriv", "chroot", "mount"):
        if not shutil.which(tool):
            return False, f"no {tool}"
    with tempfile.TemporaryDirectory() as d:  # the mounts script() needs, in a throwaway namespace
        probe = subprocess.run(
            ["unshare", "-m", "--propagation", "private", "sh", "-euc",
             f"mount -t tmpfs tmpfs {d} && mkdir {d}/u {d}/w {d}/r && "
             f"mount -t overlay overlay -o lowerdir=/,upperdir={d}/u,workdir={d}/w {d}/r && "
             f"mount -o remount,ro,bind {d}/r"], capture_output=True)
    if probe.returncode:
        return False, f"mount namespaces or overlayfs refused: {probe.stderr.decode().strip()}"
    return True, ""


def _fields(pod_name: str, index: int) -> dict[str, str]:
    return {"metadata.name": pod_name, "status.podIP": "127.0.0.1",
            "metadata.labels['apps.kubernetes.io/pod-index']": str(index)}


def env_of(container: dict[str, Any], pod_name: str, index: int, overrides: Mapping[str, str],
           secrets: Optional[Mapping[str, Mapping[str, str]]] = None) -> dict[str, str]:
    """The container's environment, as the kubelet resolves it (fieldRef, secretKeyRef);
    `overrides` stand for the cluster network (a Service's DNS name is 127.0.0.1 here, and pods
    share this machine's ports)."""
    out = {"PATH": IMAGE_PATH}
    fields = _fields(pod_name, index)
    for source in container.get("envFrom", []):  # every key of a Secret a variable (before env: env wins)
        if "secretRef" not in source:
            raise ValueError(f"the sandbox resolves envFrom secretRef only: {source}")
        out.update((secrets or {})[source["secretRef"]["name"]])
    for e in container.get("env", []):
        secret = e.get("valueFrom", {}).get("secretKeyRef")
        if secret:
            out[e["name"]] = (secrets or {})[secret["name"]][secret["key"]]
            continue
        if "valueFrom" in e:
            ref = e["valueFrom"].get("fieldRef", {}).get("fieldPath")
            if ref not in fields:
                raise ValueError(f"the sandbox cannot resolve {e['name']}: {e['valueFrom']}")
            value = fields[ref]
        else:
            value = e.get("value", "")
        out[e["name"]] = value
    # A checkout the tests run through PYTHONPATH (a worktree beside the venv's editable install):
    # its pods run it too, after the pod's own entries and before the image's site-packages.
    here = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p.startswith(str(REPO))]
    if here:
        out["PYTHONPATH"] = os.pathsep.join([*filter(None, [out.get("PYTHONPATH")]), *here])
    return {**out, **overrides}


def script(pod: dict[str, Any], container: dict[str, Any], workdir: Path, *, config: Mapping[str, str],
           claims: Mapping[str, Path], env: Mapping[str, str],
           secrets: Optional[Mapping[str, Mapping[str, str]]] = None, volumes_dir: Optional[Path] = None) -> str:
    """The shell script that builds the container's filesystem in a fresh mount namespace and
    execs its command inside it. `volumes_dir`: where the pod's volumes live (the containers of
    one pod share them, /dev/shm too); default: the container's own workdir."""
    root, layers = workdir / "root", workdir / "layers"
    lines = ["set -eu", f"mkdir -p {root} {layers}", f"mount -t tmpfs tmpfs {layers}",
             f"mkdir {layers}/upper {layers}/work",
             f"mount -t overlay overlay -o lowerdir=/,upperdir={layers}/upper,workdir={layers}/work {root}",
             # The image's interpreter must be readable by its user: here it lives under /root.
             f"chmod 755 {root}/root",
             f"mount --rbind /dev {root}/dev", f"mount -t proc proc {root}/proc", f"mount --rbind /sys {root}/sys"]
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for m in container.get("volumeMounts", []):
        v = volumes[m["name"]]
        src = (volumes_dir or workdir / "volumes") / m["name"]
        read_only = bool(m.get("readOnly"))
        if "emptyDir" in v:
            src.mkdir(parents=True, exist_ok=True)
            src.chmod(0o1777)
        elif "configMap" in v:
            src.mkdir(parents=True, exist_ok=True)
            for key, text in config.items():
                (src / key).write_text(text)
            src.chmod(0o755)
            read_only = True
        elif "secret" in v:
            src.mkdir(parents=True, exist_ok=True)
            group = (pod.get("securityContext") or {}).get("fsGroup", 0)
            for key, text in (secrets or {})[v["secret"]["secretName"]].items():
                (src / key).write_text(text)
                os.chown(src / key, 0, group)
                (src / key).chmod(v["secret"].get("defaultMode", 0o644))
            os.chown(src, 0, group)
            src.chmod(0o755)
            read_only = True
        elif "persistentVolumeClaim" in v:
            src = claims[v["persistentVolumeClaim"]["claimName"]]
            read_only = read_only or bool(v["persistentVolumeClaim"].get("readOnly"))
        else:
            raise ValueError(f"the sandbox has no {sorted(set(v) - {'name'})} volumes")
        # Inside the image, as runc resolves it (/var/run is a link to /run): the overlay mirrors
        # this machine's root, so resolving here gives the same path without leaving the root.
        target = f"{root}{os.path.realpath(m['mountPath'])}"
        lines += [f"mkdir -p {target}", f"mount --bind {src} {target}"]
        if read_only:
            lines.append(f"mount -o remount,ro,bind {target}")
    # The "image's" Python and this checkout (editable install) as an image has them: readable by
    # the pod's user (a clone made by `mktemp -d` is 0700), and there even where a volume is now
    # mounted over their path (a checkout under /tmp): an overlay of them, so nothing reaches the host.
    mounted = [os.path.realpath(m["mountPath"]) for m in container.get("volumeMounts", [])]
    keeps = sorted({os.path.realpath(sys.prefix), str(REPO)})
    keeps = [k for k in keeps if not any(k.startswith(o + "/") for o in keeps)]  # outermost only
    for i, keep in enumerate(keeps):
        covered = any(keep == m or keep.startswith(m + "/") for m in mounted)
        if covered:
            k = f"{layers}/keep{i}"
            lines += [f"mkdir -p {root}{keep} {k}/upper {k}/work",
                      f"mount -t overlay overlay -o lowerdir={keep},upperdir={k}/upper,workdir={k}/work {root}{keep}"]
        lines += [f"chmod o+x {root}{d}" for d in [*reversed(Path(keep).parents), Path(keep)] if str(d) != "/"]
        if covered:
            lines.append(f"mount -o remount,ro {root}{keep}")  # an image's files: read-only
    psc, sc = pod.get("securityContext") or {}, container.get("securityContext") or {}
    if sc.get("readOnlyRootFilesystem"):
        lines.append(f"mount -o remount,ro,bind {root}")
    uid = sc.get("runAsUser", psc.get("runAsUser", 0))
    gid = sc.get("runAsGroup", psc.get("runAsGroup", 0))
    priv = ["setpriv", f"--reuid={uid}", f"--regid={gid}"]
    priv += [f"--groups={psc['fsGroup']}"] if "fsGroup" in psc else ["--clear-groups"]
    if sc.get("allowPrivilegeEscalation") is False:
        priv.append("--no-new-privs")
    if "ALL" in (sc.get("capabilities") or {}).get("drop", []):
        priv += ["--inh-caps=-all", "--bounding-set=-all"]
    home = env.get("HOME", "/")
    command = ["env", "-i", *(f"{k}={v}" for k, v in env.items()), *container["command"], *container.get("args", [])]
    lines.append(f"exec chroot {root} " + shlex.join(priv) + " sh -c " +
                 shlex.quote(f"cd {shlex.quote(home)} && exec " + shlex.join(command)))
    return "\n".join(lines)


def start(pod: dict[str, Any], workdir: Path, *, pod_name: str, index: int = 0, config: Mapping[str, str],
          claims: Optional[Mapping[str, Path]] = None, overrides: Optional[Mapping[str, str]] = None,
          secrets: Optional[Mapping[str, Mapping[str, str]]] = None, log: Path, container: Optional[str] = None,
          volumes_dir: Optional[Path] = None) -> subprocess.Popen:
    """Start the pod's container (`container` names one of several); its stdout and stderr go to
    `log`. `secrets`: Secret name -> its data (key -> text). The containers of one pod are started
    one by one with the same `volumes_dir` (their shared volumes) and separate workdirs."""
    if container is None:
        (spec,) = pod["containers"]
    else:
        (spec,) = [c for c in pod["containers"] if c["name"] == container]
    env = env_of(spec, pod_name, index, overrides or {}, secrets)
    text = script(pod, spec, workdir, config=config, claims=claims or {}, env=env, secrets=secrets,
                  volumes_dir=volumes_dir)
    (workdir / "run.sh").write_text(text)
    with open(log, "wb") as out:
        return subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", str(workdir / "run.sh")],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
