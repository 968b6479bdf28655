// Four goroutines call mid -> leaf, allocating (the collector runs).
package main

import (
	"fmt"
	"os"
	"strconv"
)

var sink []int

//go:noinline
func leaf(i int) int {
	sink = make([]int, 64+i%32) // garbage: the collector scans stacks
	if i%7 == 0 {
		return -i
	}
	return i * 2
}

//go:noinline
func mid(i int) int { return leaf(i) + 1 }

func main() {
	n := 1000
	if len(os.Args) > 1 {
		n, _ = strconv.Atoi(os.Args[1])
	}
	done := make(chan int)
	for g := 0; g < 4; g++ {
		go func(g int) {
			s := 0
			for i := g; i < n; i += 4 {
				s += mid(i)
			}
			done <- s
		}(g)
	}
	s := 0
	for g := 0; g < 4; g++ {
		s += <-done
	}
	fmt.Printf("calls=%d sum=%d\n", n, s)
}
