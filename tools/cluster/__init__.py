"""A real Kubernetes of one or two nodes on this host, for the tests (docs/cluster.md).

    python -m tools.cluster up|down|build|restart NAME     (from the checkout's root)

:mod:`.cli` runs the commands; :mod:`.actions` is the one ordered list of what `up` does and of
the operators it installs. The Go modules beside these files are named for what they build.
"""
