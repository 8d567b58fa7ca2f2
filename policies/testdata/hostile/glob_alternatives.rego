# attacks: glob.match of "*{a,b}a" four times over 256 a's: the glob matcher backtracked through every split, for minutes and gigabytes inside one call
# expect: deny
package wb.admission

t0 := "aaaaaaaaaaaaaaaa"

text := concat("", [t0, t0, t0, t0, t0, t0, t0, t0, t0, t0, t0, t0, t0, t0, t0, t0])

deny contains "answered in time" if not glob.match("*{a,b}a*{a,b}a*{a,b}a*{a,b}a*c*", [], text)
