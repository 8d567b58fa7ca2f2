# attacks: concat doubling a string 40 times (a 1 TB string from 16 bytes of source)
# expect: deny
package wb.admission

s0 := "0123456789abcdef"

s1 := concat("", [s0, s0, s0, s0, s0, s0, s0, s0, s0, s0, s0, s0, s0, s0, s0, s0])

s2 := concat("", [s1, s1, s1, s1, s1, s1, s1, s1, s1, s1, s1, s1, s1, s1, s1, s1])

s3 := concat("", [s2, s2, s2, s2, s2, s2, s2, s2, s2, s2, s2, s2, s2, s2, s2, s2])

s4 := concat("", [s3, s3, s3, s3, s3, s3, s3, s3, s3, s3, s3, s3, s3, s3, s3, s3])

s5 := concat("", [s4, s4, s4, s4, s4, s4, s4, s4, s4, s4, s4, s4, s4, s4, s4, s4])

s6 := concat("", [s5, s5, s5, s5, s5, s5, s5, s5, s5, s5, s5, s5, s5, s5, s5, s5])

s7 := concat("", [s6, s6, s6, s6, s6, s6, s6, s6, s6, s6, s6, s6, s6, s6, s6, s6])

s8 := concat("", [s7, s7, s7, s7, s7, s7, s7, s7, s7, s7, s7, s7, s7, s7, s7, s7])

s9 := concat("", [s8, s8, s8, s8, s8, s8, s8, s8, s8, s8, s8, s8, s8, s8, s8, s8])

s10 := concat("", [s9, s9, s9, s9, s9, s9, s9, s9, s9, s9, s9, s9, s9, s9, s9, s9])

deny contains "never" if count(s10) < 0
