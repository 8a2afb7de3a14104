# node_lost.py DIR: two MPI ranks on two nodes. After a barrier each writes
# DIR/ready<rank>; rank 0 then waits in a receive from MPI_ANY_SOURCE that
# nothing will match, rank 1 sleeps. The test kills rank 1's node's psmd:
# the job must end with an error (tests/mpi/node_lost.sh).
import sys
import time

from mpi4py import MPI

comm = MPI.COMM_WORLD
comm.Barrier()
open("%s/ready%d" % (sys.argv[1], comm.rank), "w").close()
if comm.rank == 0:
    comm.recv(source=MPI.ANY_SOURCE)
    print("node_lost: rank 0's receive returned", flush=True)
else:
    time.sleep(300)
