#!/bin/sh
# Slurm TaskProlog: every "export X=Y" line printed here is set in each task's environment.
# The virtual nodes all live on 127.0.0.1: keep OpenMPI's TCP traffic on loopback, and let
# ranks oversubscribing the 2 real cores yield instead of spinning.
echo "export OMPI_MCA_btl_tcp_if_include=lo"
echo "export OMPI_MCA_mpi_yield_when_idle=1"
