# attacks: regex.match of 12,000 optional atoms (a 38-byte pattern) on 65,536 a's: its one search, counted as it reads, steps 24,000 threads at each byte (seconds in one call without its bound)
# expect: deny
package wb.admission

pattern := concat("", ["(?:", "a?a?a?a?a?a?a?a?a?a?a?a?", "){1000}b"])

t0 := "aaaaaaaaaaaaaaaa"

t1 := concat("", [t0, t0, t0, t0, t0, t0, t0, t0, t0, t0, t0, t0, t0, t0, t0, t0])

t2 := concat("", [t1, t1, t1, t1, t1, t1, t1, t1, t1, t1, t1, t1, t1, t1, t1, t1])

t3 := concat("", [t2, t2, t2, t2, t2, t2, t2, t2, t2, t2, t2, t2, t2, t2, t2, t2])

deny contains "never" if regex.match(pattern, t3)
