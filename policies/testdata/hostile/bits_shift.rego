# attacks: bits.lsh(1, 10^10) makes a 1.25 GB integer in one call, then prints it in decimal
# expect: deny
package wb.admission

deny contains "never" if bits.lsh(1, 10000000000) < 0
