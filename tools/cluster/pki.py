"""The cluster's certificates and kubeconfigs, made with the openssl command line.

One CA signs every serving and client certificate; a client's user and groups are its
certificate's CN and O, as in a kubeadm cluster (so the Node authorizer and RBAC see the same
identities they see there). Keys are ECDSA P-256. Made once; a second `up` reuses them.
"""

from __future__ import annotations

import base64
import json
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tools.cluster.layout import API_PORT, CLUSTER_DOMAIN, KUBERNETES_SERVICE_IP, NODE_IP, NODES

DAYS = "3650"


@dataclass(frozen=True)
class Cert:
    name: str
    cn: str
    org: str = ""
    dns: tuple[str, ...] = ()
    ips: tuple[str, ...] = ()
    server: bool = False


# Client identities: the component's name as RBAC knows it (system:* are bootstrap roles).
CERTS = (
    Cert("apiserver", "kube-apiserver", server=True,
         dns=("kubernetes", "kubernetes.default", "kubernetes.default.svc",
              f"kubernetes.default.svc.{CLUSTER_DOMAIN}", "localhost"),
         ips=("127.0.0.1", NODE_IP, KUBERNETES_SERVICE_IP)),
    Cert("apiserver-kubelet-client", "kube-apiserver-kubelet-client", "system:masters"),
    Cert("admin", "kubernetes-admin", "system:masters"),
    Cert("controller-manager", "system:kube-controller-manager"),
    Cert("scheduler", "system:kube-scheduler"),
    Cert("kube-proxy", "system:kube-proxy"),
    Cert("coredns", "system:coredns"),
    Cert("local-path-provisioner", "system:local-path-provisioner"),
    Cert("registry", "ddp-registry", server=True, dns=("localhost",), ips=(NODE_IP, "127.0.0.1")),
    # Each node's kubelet: its client identity as the Node authorizer knows it, and its serving
    # certificate for the node's address (the API server verifies it: logs, exec).
    *(cert for node in NODES for cert in (
        Cert(f"kubelet-client{node.suffix}", f"system:node:{node.name}", "system:nodes"),
        Cert(f"kubelet{node.suffix}", node.name, server=True, dns=(node.name, "localhost"),
             ips=(node.ip, "127.0.0.1")))),
)


def _openssl(*args: str) -> None:
    proc = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed: {proc.stderr.strip()}")


def _key(path: Path) -> None:
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-out", str(path))
    path.chmod(0o600)


def make(pki: Path) -> None:
    """CA, service-account key pair and every certificate of CERTS, where missing."""
    pki.mkdir(parents=True, exist_ok=True)
    if not (pki / "ca.crt").exists():
        _key(pki / "ca.key")
        _openssl("req", "-x509", "-new", "-key", str(pki / "ca.key"), "-days", DAYS,
                 "-subj", "/CN=ddp-trainer-cluster-ca", "-out", str(pki / "ca.crt"))
    if not (pki / "sa.pub").exists():
        _key(pki / "sa.key")
        _openssl("pkey", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub"))
    for cert in CERTS:
        if not (pki / f"{cert.name}.crt").exists():
            sign(pki, cert)


def sign(pki: Path, cert: Cert) -> None:
    _key(pki / f"{cert.name}.key")
    subject = f"/CN={cert.cn}" + (f"/O={cert.org}" if cert.org else "")
    sans = [f"DNS:{d}" for d in cert.dns] + [f"IP:{i}" for i in cert.ips]
    ext = ["basicConstraints=critical,CA:FALSE", "keyUsage=critical,digitalSignature",
           f"extendedKeyUsage={'serverAuth' if cert.server else 'clientAuth'}"]
    if sans:
        ext.append("subjectAltName=" + ",".join(sans))
    with tempfile.NamedTemporaryFile("w", suffix=".ext") as extfile:
        extfile.write("\n".join(ext) + "\n")
        extfile.flush()
        csr = pki / f"{cert.name}.csr"
        _openssl("req", "-new", "-key", str(pki / f"{cert.name}.key"), "-subj", subject,
                 "-out", str(csr))
        _openssl("x509", "-req", "-in", str(csr), "-CA", str(pki / "ca.crt"), "-CAkey",
                 str(pki / "ca.key"), "-CAcreateserial", "-days", DAYS, "-extfile",
                 extfile.name, "-out", str(pki / f"{cert.name}.crt"))
        csr.unlink()


def kubeconfig(pki: Path, user: str, path: Path, server: str | None = None) -> Path:
    """A kubeconfig for client certificate `user` (JSON, which is YAML)."""
    def b64(name: str) -> str:
        return base64.b64encode((pki / name).read_bytes()).decode()

    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "ddp-trainer",
        "clusters": [{"name": "ddp-trainer", "cluster": {
            "server": server or f"https://{NODE_IP}:{API_PORT}",
            "certificate-authority-data": b64("ca.crt")}}],
        "users": [{"name": user, "user": {"client-certificate-data": b64(f"{user}.crt"),
                                          "client-key-data": b64(f"{user}.key")}}],
        "contexts": [{"name": "ddp-trainer", "context": {"cluster": "ddp-trainer",
                                                         "user": user}}],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config, indent=1) + "\n")
    path.chmod(0o600)
    return path


def kubeconfig_token(pki: Path, token: str, path: Path) -> Path:
    """A kubeconfig for a ServiceAccount's bearer token (TokenRequest API)."""
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "ddp-trainer",
        "clusters": [{"name": "ddp-trainer", "cluster": {
            "server": f"https://{NODE_IP}:{API_PORT}",
            "certificate-authority-data": base64.b64encode((pki / "ca.crt").read_bytes())
            .decode()}}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "ddp-trainer", "context": {"cluster": "ddp-trainer",
                                                         "user": "sa"}}],
    }
    path.write_text(json.dumps(config, indent=1) + "\n")
    path.chmod(0o600)
    return path
