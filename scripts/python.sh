#!/bin/sh
# The interpreter `make` builds the venv from: the distribution's /usr/bin/python3 when it is
# 3.11 or newer and can make a venv with pip (Debian: the python3-venv package), else the
# first python3 on PATH.
#
# Why: every process the demo and the tests start is this interpreter (the sandboxes' workers,
# APIs, agents and emulators, the training ranks, the CLI), and distributions build CPython
# with profile-guided and link-time optimisation, which a pyenv or source build has only when
# asked (--enable-optimizations --with-lto). On the CI machine (Debian 12's 3.11.2 against
# pyenv's 3.11.7 built without them) a start is 11 ms against 38 ms and imports ~12 % quicker;
# `make test` spent 8-19 % less CPU in three pairs of runs (docs/testing.md, "the interpreter").
# PYTHON=... on make's command line chooses another.
py=/usr/bin/python3
if [ -x "$py" ] && "$py" -c '
import sys
if sys.version_info < (3, 11):
    sys.exit(1)
import ensurepip
ensurepip.version()  # on Debian, ensurepip comes with python3-venv
' >/dev/null 2>&1; then
  echo "$py"
else
  echo python3
fi
