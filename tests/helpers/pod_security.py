"""PodSecurity admission, acted out: the checks of the Pod Security Standards' `baseline` and
`restricted` levels (https://kubernetes.io/docs/concepts/security/pod-security-standards/, as of
Kubernetes 1.34), applied to a pod spec. No cluster runs here and kmock enforces nothing, so the
tests and the emulator's admission hook use this checker; each message names the rule as the
API server's PodSecurity plugin does."""
from __future__ import annotations

from typing import Any

BASELINE_CAPABILITIES = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                         "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
                "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                "net.ipv4.tcp_keepalive_probes"}
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}


def _containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod.get("initContainers", []), *pod.get("containers", []), *pod.get("ephemeralContainers", [])]


def baseline(pod: dict[str, Any]) -> list[str]:
    out = []
    psc = pod.get("securityContext") or {}
    containers = _containers(pod)
    scs = {c["name"]: c.get("securityContext") or {} for c in containers}
    if (psc.get("windowsOptions") or {}).get("hostProcess") or \
            any((sc.get("windowsOptions") or {}).get("hostProcess") for sc in scs.values()):
        out.append("hostProcess")
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key):
            out.append(f"host namespaces ({key}=true)")
    for name, sc in scs.items():
        if sc.get("privileged"):
            out.append(f'privileged (container "{name}" must not set securityContext.privileged=true)')
        added = set((sc.get("capabilities") or {}).get("add") or []) - BASELINE_CAPABILITIES
        if added:
            out.append(f'non-default capabilities (container "{name}" must not include {sorted(added)})')
        if sc.get("procMount", "Default") != "Default":
            out.append(f'procMount (container "{name}")')
    for v in pod.get("volumes") or []:
        if "hostPath" in v:
            out.append(f'hostPath volumes (volume "{v["name"]}")')
    for c in containers:
        if any(p.get("hostPort") for p in c.get("ports") or []):
            out.append(f'hostPort (container "{c["name"]}")')
    for who, sc in [("pod", psc), *scs.items()]:
        if (sc.get("appArmorProfile") or {}).get("type") == "Unconfined":
            out.append(f"forbidden AppArmor profile ({who})")
        se = sc.get("seLinuxOptions") or {}
        if se.get("type", "") not in SELINUX_TYPES or se.get("user") or se.get("role"):
            out.append(f"seLinuxOptions ({who})")
        if (sc.get("seccompProfile") or {}).get("type") == "Unconfined":
            out.append(f"seccompProfile ({who} must not set securityContext.seccompProfile.type to Unconfined)")
    for s in psc.get("sysctls") or []:
        if s.get("name") not in SAFE_SYSCTLS:
            out.append(f"forbidden sysctls ({s.get('name')})")
    return out


def restricted(pod: dict[str, Any]) -> list[str]:
    """Every violation of the restricted level (which includes baseline)."""
    out = baseline(pod)
    psc = pod.get("securityContext") or {}
    for v in pod.get("volumes") or []:
        kinds = set(v) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            out.append(f'restricted volume types (volume "{v["name"]}" uses {sorted(kinds - RESTRICTED_VOLUMES)})')
    pod_seccomp = (psc.get("seccompProfile") or {}).get("type")
    for c in _containers(pod):
        name, sc = c["name"], c.get("securityContext") or {}
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f'allowPrivilegeEscalation != false (container "{name}" must set '
                       "securityContext.allowPrivilegeEscalation=false)")
        non_root = sc.get("runAsNonRoot", psc.get("runAsNonRoot"))
        if non_root is not True:
            out.append(f'runAsNonRoot != true (pod or container "{name}" must set securityContext.runAsNonRoot=true)')
        if sc.get("runAsUser", psc.get("runAsUser")) == 0:
            out.append(f'runAsUser=0 (container "{name}")')
        if sc.get("seccompProfile", {}).get("type", pod_seccomp) not in ("RuntimeDefault", "Localhost"):
            out.append(f'seccompProfile (pod or container "{name}" must set securityContext.seccompProfile.type '
                       'to "RuntimeDefault" or "Localhost")')
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append(f'unrestricted capabilities (container "{name}" must set '
                       'securityContext.capabilities.drop=["ALL"])')
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            out.append(f'unrestricted capabilities (container "{name}" must not include '
                       f'{sorted(set(caps["add"]) - {"NET_BIND_SERVICE"})} in securityContext.capabilities.add)')
    return out
