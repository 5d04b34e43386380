"""Our image, built by podman from the Dockerfile as an air-gapped cluster would build it.

Modules, one job each:

- :mod:`.podman`     the podman CLI with the project's containers.conf
- :mod:`.wheels`     a local wheel index with what the Dockerfile installs
- :mod:`.image`      the base image (debootstrap) and the trainer image (our Dockerfile)
- :mod:`.dockerfile` a reader of the Dockerfile, by build stage (the image tests read it too)

The release (tools/release.py), the test cluster (tools/cluster) and the tests all build with
it; it lives under tools/ because tools never import tests. The pods that run the image are
the real cluster's (tests/cluster, docs/cluster.md); docs/e2e.md says why the podman scenarios
that played the operator and the kubelet were retired.
"""
