"""What the tests share: real parts started for them (``sshd`` peers, a Slurm cluster, the test VM
and its guest), fakes where no real part can exist here or where a test must script a failure
(``fakepeer``, ``fakesystemd``, ``fakerustup``, ``gpus``: no NVIDIA GPU on these machines), and helpers
more than one test module uses. No test module imports another; fixtures live in ``conftest.py``."""
