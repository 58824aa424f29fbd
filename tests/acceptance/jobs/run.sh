#!/bin/sh
# A user's script, shipped in the InputSandbox and named as DIRAC users name it.
echo "hello from $(hostname) with $# argument(s): $*"
echo "result of the acceptance job" > result.txt
