"""Our image, built by podman from the Dockerfile as an air-gapped cluster would build it.

Modules, one job each:

- :mod:`.podman`     the podman CLI with the project's containers.conf
- :mod:`.wheels`     a local wheel index with what the Dockerfile installs
- :mod:`.image`      the base image (debootstrap) and the trainer image (our Dockerfile)

The pods that run it are the real cluster's (tests/cluster, docs/cluster.md); docs/e2e.md says
why the podman scenarios that played the operator and the kubelet were retired.
"""
