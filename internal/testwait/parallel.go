package testwait

import (
	"flag"
	"strconv"
)

// Parallel lets n parallel tests run at once, unless -parallel was given, where go test's
// default is GOMAXPROCS: for a package whose tests mostly wait (on guests, on timers), and on
// 2 cores would mostly wait for one another. Call it from TestMain (it parses the command
// line, as m.Run would).
func Parallel(n int) {
	if !flag.Parsed() {
		flag.Parse()
	}
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given {
		_ = flag.Set("test.parallel", strconv.Itoa(n))
	}
}
