"""The project's container images, built and run by a real engine on the machine the tests run on.

    engine.py   a running Docker engine: found, or installed from Debian and started here
    base.py     a Python base image made with debootstrap, for machines without a registry
    images.py   the worker and controller images, built from the Dockerfiles on that base
    fixtures.py the `image` test tier's pytest fixtures
    debian.py   Debian packages installed with apt, and the apt mirror debootstrap uses

`python -m tests.containers build` builds (or reuses) all three images and prints their tags.
Code that needs the images imports `tests.containers.images.ensure_images()` and `save()`.
"""


class ContainersUnavailable(RuntimeError):
    """No container engine can run here (or the base image cannot be made): the message says why.

    Tests skip with it, or fail where the tier is required (CI). A Dockerfile that does not build
    is not this: that raises ImageBuildFailed, always a failure."""
