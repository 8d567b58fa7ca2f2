# attacks: regex.find_n of every match of ".*b|a" in 40,960 a's: each search scans to the end of the text (quadratic, in one call)
# expect: deny
package wb.admission

t0 := "aaaaaaaaaaaaaaaa"

t1 := concat("", [t0, t0, t0, t0, t0, t0, t0, t0, t0, t0, t0, t0, t0, t0, t0, t0])

t2 := concat("", [t1, t1, t1, t1, t1, t1, t1, t1, t1, t1, t1, t1, t1, t1, t1, t1])

text := concat("", [t2, t2, t2, t2, t2, t2, t2, t2, t2, t2])

deny contains "never" if count(regex.find_n(".*b|a", text, -1)) < 0
