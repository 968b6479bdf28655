// cgo_four N: calls the 4-byte C function four N times, through the C
// loop four_loop, from 4 goroutines that also allocate and yield between
// their C calls (the Go runtime moves them between threads, runs its
// collector, preempts them with signals). Prints the number of calls and
// the sum of four's results, and exits with status 3.
package main

/*
long four_loop(long from, long n);
*/
import "C"

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
)

const workers = 4
const chunk = 50

func main() {
	n, err := strconv.ParseInt(os.Args[1], 10, 64)
	if err != nil {
		fmt.Println("usage: cgo_four N")
		os.Exit(2)
	}
	sums := make([]int64, workers)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			from := n * int64(w) / workers
			to := n * int64(w+1) / workers
			var garbage [][]byte
			for at := from; at < to; at += chunk {
				k := to - at
				if k > chunk {
					k = chunk
				}
				sums[w] += int64(C.four_loop(C.long(at), C.long(k)))
				garbage = append(garbage, make([]byte, 1024))
				if len(garbage) > 64 {
					garbage = nil
				}
				runtime.Gosched()
			}
		}(w)
	}
	wg.Wait()
	var sum int64
	for _, s := range sums {
		sum += s
	}
	fmt.Printf("calls=%d sum=%d\n", n, sum)
	os.Exit(3)
}
