"""The ported tests PyTorch passes here and we do not, each with its reason (README.md lists them
too). run.py --check fails when one of them passes, so the list stays true."""

EXCEPTIONS = {
}
