# node_lost.py DIR: two MPI ranks on two nodes. After a barrier rank 0 posts
# a receive from MPI_ANY_SOURCE that nothing will match, then writes
# DIR/ready0 and waits for it; rank 1 writes DIR/ready1 and sleeps. So once
# both files exist the receive is posted, and the test kills rank 1's
# node's psmd: the job must end with an error (tests/mpi/node_lost.sh).
import sys
import time

from mpi4py import MPI

comm = MPI.COMM_WORLD
comm.Barrier()
if comm.rank == 0:
    request = comm.irecv(source=MPI.ANY_SOURCE)
    open("%s/ready0" % sys.argv[1], "w").close()
    request.wait()
    print("node_lost: rank 0's receive returned", flush=True)
else:
    open("%s/ready1" % sys.argv[1], "w").close()
    time.sleep(300)
