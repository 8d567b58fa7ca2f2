# attacks: regex.match with a pattern of 12,288 optional atoms on 65,536 bytes: one call runs the NFA for seconds
# expect: deny
package wb.admission

p0 := "a?a?a?a?a?a?a?a?"

p1 := concat("", [p0, p0, p0, p0, p0, p0, p0, p0, p0, p0, p0, p0, p0, p0, p0, p0])

p2 := concat("", [p1, p1, p1, p1, p1, p1, p1, p1, p1, p1, p1, p1, p1, p1, p1, p1])

pattern := concat("", [p2, p2, p2, p2, p2, p2, "b"])

t0 := "aaaaaaaaaaaaaaaa"

t1 := concat("", [t0, t0, t0, t0, t0, t0, t0, t0, t0, t0, t0, t0, t0, t0, t0, t0])

t2 := concat("", [t1, t1, t1, t1, t1, t1, t1, t1, t1, t1, t1, t1, t1, t1, t1, t1])

t3 := concat("", [t2, t2, t2, t2, t2, t2, t2, t2, t2, t2, t2, t2, t2, t2, t2, t2])

deny contains "never" if regex.match(pattern, t3)
