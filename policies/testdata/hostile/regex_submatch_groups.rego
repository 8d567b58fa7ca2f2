# attacks: regex.find_all_string_submatch_n of 4,000 optional groups (16 KiB) on 60 bytes: the work check counted instructions times text, but the NFA copies every thread's 8,000 capture positions at each step: seconds inside one call
# expect: deny
package wb.admission

g0 := "(a?)(a?)(a?)(a?)(a?)(a?)(a?)(a?)(a?)(a?)(a?)(a?)(a?)(a?)(a?)(a?)"

g1 := concat("", [g0, g0, g0, g0, g0, g0, g0, g0, g0, g0, g0, g0, g0, g0, g0, g0])

g2 := concat("", [g1, g1, g1, g1, g1, g1, g1, g1, g1, g1, g1, g1, g1, g1, g1])

pattern := concat("", [g2, g0, g0, g0, g0, g0, g0, g0, g0, g0, g0])

t0 := "aaaaaaaaaaaaaaaa"

text := concat("", [t0, t0, t0, "aaaaaaaaaaa", "b"])

deny contains "answered in time" if count(regex.find_all_string_submatch_n(pattern, text, -1)) < 100
